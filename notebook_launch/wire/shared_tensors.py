"""Tensors that cross a process boundary at memory speed: their bytes go through a memfd.

A rank's result (and, with ``start_method="spawn"``, the launched job's
arguments) is pickled as before (cloudpickle, or whatever pickler class the
caller passes), except that every torch storage of at least ``INLINE_LIMIT``
bytes is written straight into a memfd, page-aligned, and the pickle stream
holds only its index. The reader maps each storage's pages copy-on-write
(``MAP_PRIVATE``) and builds the tensors over them: no copy on the reading
side, and the writer's copy is the only one. Writing into such a tensor later
copies just the pages written, like memory after a fork, so a later launch's
forked ranks or the notebook never see each other's changes.

Why a memfd and not a ``/dev/shm`` file or torch's own storage sharing: a
memfd has no name, so nothing can be left behind. The parent creates one per
rank before starting it (inherited by fork, passed by number to a spawned
rank); when the parent and the rank are gone, so is the memory, whichever
dies first and however (a SIGKILL mid-transfer included). It is not limited
by the size of ``/dev/shm`` (64 MB in a default Docker container, where
``torch.multiprocessing`` fails with a bus error), and it needs no socket to
pass descriptors. The memfd is sealed against shrinking, so a mapping can
never turn into SIGBUS. Where ``os.memfd_create`` is missing (macOS), the
bytes travel inside the pickle stream instead, still without ``torch.save``'s
per-storage archive.

Storages shared by several tensors (views, a parameter tied to another) are
written once and come back shared. Storages on another device (CUDA) are
copied to the CPU, so the notebook never initializes a GPU; tensors torch pickles
without a storage, as a rebuild onto their device (XLA), are pickled as CPU copies
(``rebuilds_off_cpu``), wherever they are: in modules, dataclasses, any object.

What comes back is what ``torch.save`` would keep: every dtype (bool, every int and uint
width, float16/bfloat16/32/64, complex, every float8), layout (strided, sparse COO/CSR/CSC/BSR,
nested, quantized), class (``nn.Parameter``, tensor subclasses), shape, strides, storage offset
and ``requires_grad``, on the CPU; autograd history is not (a tensor comes back as a leaf).
One load maps its first ``MAPPINGS_PER_LOAD`` storages one by one and the rest of the file at
once (each mapping counts against ``vm.max_map_count``); where no mapping is left, the bytes
are read into memory, or the error names the limit.

numpy arrays (``numpy.ndarray`` itself, of any dtype but object, structured ones included) go
the same way: their bytes are written to the memfd and the notebook's array is built over its
mapped pages, writable and copy-on-write. What pickle would copy anyway comes back as pickle
brings it: a non-contiguous array comes back contiguous, an object array through pickle.

The pickle stream itself goes to the memfd too once it is big (``_Stream``: a big ``bytes``
or ``str``, a list of a million numbers), so what crosses the event pipe or the command socket
stays small whatever the result's size, and the notebook reads the stream from the file's pages
(one copy, as ``pickle.loads`` makes) instead of through a pipe into buffers it copies again.

Here: ``dumps`` and ``loads``, the stream and the unpickler. What each object becomes in the stream is
``tensor_reducers``'s; the memfd (appending, mapping, reading back) is ``tensor_file``'s.
"""
from __future__ import annotations

import io
import logging
import os
import pickle
import sys
from collections.abc import Callable
from typing import Any

# What other modules import from here: the file and the pickler live in modules of their own
# (issue 46), shared_tensors stays the one name for both sides' pickling with tensors.
from . import tensor_reducers
from .tensor_file import Appender, create_file, map_private, punch_hole, read_region
from .tensor_reducers import INLINE_LIMIT, cpu_copy, pickler_class, rebuilds_off_cpu

__all__ = ["INLINE_LIMIT", "MAPPINGS_PER_LOAD", "Appender", "cpu_copy", "create_file", "dumps", "loads",
           "pickler_class", "rebuilds_off_cpu"]
logger = logging.getLogger("notebook_launch")

# Storages one load maps one by one (each freed with its tensor); the rest share one mapping.
# Each mapping counts against vm.max_map_count (65530 by default), so a result of many
# thousand tensors must not take one each.
MAPPINGS_PER_LOAD = 256
# The pickle stream goes to the file in pieces: every write of at least BIG_WRITE bytes (the
# pickler writes a big bytes or str payload on its own) and every STREAM_CHUNK of the rest.
BIG_WRITE = 1 << 20
STREAM_CHUNK = 1 << 20
# A big write goes to the file in pieces of at most this: a result's reader frees each piece
# once read, so the notebook holds the value and one piece, not the value and the whole stream.
STREAM_PIECE = 64 << 20
# What ``dumps`` returns when the stream is in the file: this, then the pickled list of its pieces.
# A pickle of protocol 2 or later starts with b"\x80", so neither can be taken for the other.
STREAM_IN_FILE = b"notebook_launch stream in file\n"


class _Stream:
    """The file a pickler writes its stream to: in memory while small; every big write (a
    ``bytes`` or ``str`` payload the pickler writes on its own, without a copy) and every
    ``STREAM_CHUNK`` of the rest go to the result file, so the rank holds no second copy of a
    big value and the stream never crosses a pipe. ``pieces``: the stream in order, each a
    (offset, length) in the file or bytes."""

    def __init__(self, file: Appender) -> None:
        self._file = file
        self._buffer = bytearray()
        self.pieces: list[Any] = []

    def write(self, data: Any) -> int:
        # The pickler writes bytes, or a PickleBuffer of any contiguous memory (an F-ordered one
        # cannot be cast): its raw bytes, in memory order, as pickle writes them
        view = data.raw() if isinstance(data, pickle.PickleBuffer) else memoryview(data).cast("B")
        if view.nbytes >= BIG_WRITE and self._file.fd is not None:
            self._flush()
            for start in range(0, view.nbytes, STREAM_PIECE):
                place = self._file.append(view[start:start + STREAM_PIECE])
                if place is None:   # the file reached its size limit: the rest stays here
                    self._buffer += view[start:]
                    break
                self.pieces.append(place)
            return view.nbytes
        self._buffer += view
        if len(self._buffer) >= STREAM_CHUNK:
            self._flush()
        return view.nbytes

    def _flush(self) -> None:
        if self._buffer:
            place = self._file.append(memoryview(self._buffer))
            if place is not None:
                self.pieces.append(place)
                self._buffer = bytearray()

    def payload(self) -> bytes:
        """The stream itself while it all stayed in memory, else ``STREAM_IN_FILE`` and its pieces."""
        if not self.pieces:
            return bytes(self._buffer)
        self._flush()   # the tail too: what crosses the pipe stays a few bytes
        if self._buffer:   # the file reached its size limit
            self.pieces.append(bytes(self._buffer))
            self._buffer = bytearray()
        return STREAM_IN_FILE + pickle.dumps(self.pieces, protocol=pickle.HIGHEST_PROTOCOL)


class _PiecedStream(io.RawIOBase):
    """The stream ``_Stream`` wrote, read back for the unpickler: bytes pieces as they are, file
    pieces read from the file (``preadv``: the kernel copies the pages straight into the
    object the unpickler builds, which reads a big payload with ``readinto``; one copy, as
    ``pickle.loads`` makes, and no mapping of the file in the notebook)."""

    def __init__(self, fd: int | None, pieces: list[Any], discard: bool = False) -> None:
        super().__init__()
        self._fd = fd
        self._pieces = list(pieces)
        self._next = 0
        self._discard = discard   # free each file piece's pages once read (see ``loads``)
        self._memory = memoryview(b"")             # what is left of a bytes piece
        self._piece: tuple[int, int] | None = None   # the file piece being read
        self._read = 0                               # how much of it was read

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        target = memoryview(buffer).cast("B")
        done = 0
        while done < target.nbytes:
            if self._left() == 0 and not self._advance():
                break
            count = min(target.nbytes - done, self._left())
            if self._piece is None:
                target[done:done + count] = self._memory[:count]
                self._memory = self._memory[count:]
            else:
                assert self._fd is not None
                count = os.preadv(self._fd, [target[done:done + count]], self._piece[0] + self._read)
                if count <= 0:
                    raise pickle.UnpicklingError("the result file ended before the pickle stream did")
                self._read += count
            done += count
        return done

    def _left(self) -> int:
        return self._memory.nbytes if self._piece is None else self._piece[1] - self._read

    def _advance(self) -> bool:
        self._release()
        if self._next >= len(self._pieces):
            return False
        piece = self._pieces[self._next]
        self._next += 1
        if isinstance(piece, bytes):
            self._memory = memoryview(piece)
            return True
        if self._fd is None:
            raise pickle.UnpicklingError("this pickle's stream is in a shared memory file that was not passed")
        self._piece, self._read = piece, 0
        return True

    def _release(self) -> None:
        self._memory.release()
        self._memory = memoryview(b"")
        if self._piece is not None and self._discard and self._fd is not None:
            punch_hole(self._fd, *self._piece)
        self._piece = None

    def close(self) -> None:
        self._release()
        super().close()



def dumps(value: Any, fd: "int | None | Callable[[], int | None]", base: type | None = None) -> bytes:
    """Pickle ``value``; big storages' and arrays' bytes go to ``fd`` (appended; a function: it
    makes the file when the first such part comes, see ``Appender``), and so does a big stream
    (then the returned bytes only say where its pieces are)."""
    if base is None:
        import cloudpickle
        base = cloudpickle.Pickler
    file = Appender(fd)
    stream = _Stream(file)
    pickler_class(base)(stream, file, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    return stream.payload()


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: Any, fd: int | None) -> None:
        super().__init__(file)
        self._fd = fd
        self._storages: dict = {}
        self._mapped = 0                       # storages mapped one by one so far
        self._rest: tuple[int, Any] | None = None   # (offset, mapping) of the file's remainder

    def find_class(self, module: str, name: str) -> Any:
        if module == tensor_reducers.__name__ and name == "_rebuild_storage":
            return self._storage
        if module == tensor_reducers.__name__ and name == "_rebuild_array":
            return self._array
        return super().find_class(module, name)

    def _array(self, place: Any, dtype: Any, shape: Any, order: str, writeable: bool = True) -> Any:
        import numpy
        offset, nbytes = place
        flat: Any = numpy.frombuffer(self._region(offset, nbytes), dtype=dtype)
        array = flat.reshape(shape, order=order)
        array.flags.writeable = writeable
        return array

    def _storage(self, index: int, dtype: Any, place: Any = None) -> Any:
        import torch
        untyped = self._storages.get(index)
        if untyped is None:
            untyped = self._storages[index] = self._load(torch, place)
        # A bare UntypedStorage in the stream is what torch pickles for the dtypes TypedStorage
        # lacks (float8_*, uint16/32/64: ``_rebuild_tensor_v3``), and that rebuild reads the
        # storage's ``_untyped_storage``: a byte-typed wrapper gives it, as torch.load does.
        return torch.storage.TypedStorage(wrap_storage=untyped, dtype=dtype or torch.uint8, _internal=True)

    def _load(self, torch: Any, place: Any) -> Any:
        if isinstance(place, bytes):
            return torch.UntypedStorage.from_buffer(place, dtype=torch.uint8) if place else torch.UntypedStorage(0)
        offset, nbytes = place
        return torch.frombuffer(self._region(offset, nbytes), dtype=torch.uint8).untyped_storage()

    def _region(self, offset: int, nbytes: int) -> Any:
        """``nbytes`` of the file from ``offset``: mapped on its own (the first MAPPINGS_PER_LOAD),
        as a slice of one mapping of the rest of the file, or read into a bytearray."""
        if self._fd is None:
            raise pickle.UnpicklingError("this pickle holds tensors or arrays in a shared memory file "
                                         "that was not passed")
        if self._rest is None and self._mapped < MAPPINGS_PER_LOAD:
            try:
                mapping = map_private(self._fd, offset, nbytes)
                self._mapped += 1
                return mapping
            except OSError as exc:   # out of mappings (vm.max_map_count) or address space
                logger.debug("mapping a region failed (%s); mapping the rest of the file at once", exc)
        return self._from_rest(offset, nbytes)

    def _from_rest(self, offset: int, nbytes: int) -> Any:
        """The region as a slice of one mapping of the rest of the file (regions come in file
        order): past MAPPINGS_PER_LOAD of them, or when no single mapping is left, one mapping
        serves them all; it is unmapped when the last of them is freed. Failing that, a copy."""
        assert self._fd is not None
        if self._rest is None or offset < self._rest[0]:
            end = os.fstat(self._fd).st_size
            try:
                self._rest = (offset, map_private(self._fd, offset, end - offset))
            except OSError as exc:
                return read_region(self._fd, offset, nbytes, exc)
        start, mapping = self._rest
        return memoryview(mapping).cast("B")[offset - start:offset - start + nbytes]



def loads(data: bytes, fd: int | None, *, discard_stream: bool = False) -> Any:
    """Unpickle what ``dumps`` wrote; tensors and arrays map ``fd``'s pages (the fd may be closed
    afterwards). ``discard_stream``: the file is this load's alone (a result), so the pages of a
    stream kept there are freed piece by piece as they are read, though tensors mapped from the
    file live on."""
    stream: Any
    if bytes(data[:len(STREAM_IN_FILE)]) == STREAM_IN_FILE:
        stream = _PiecedStream(fd, pickle.loads(memoryview(data)[len(STREAM_IN_FILE):]), discard_stream)
    else:
        stream = io.BytesIO(data)
    unpickler = _Unpickler(stream, fd)
    try:
        value = unpickler.load()
        _validate_sparse_tensors()
        return value
    finally:   # its memo holds a bound method of itself: without this, the storages it
        unpickler.memo.clear()   # kept would wait for the garbage collector to be unmapped
        unpickler._storages.clear()
        unpickler._rest = None
        stream.close()



def _validate_sparse_tensors() -> None:
    """What torch.load does after unpickling: torch's sparse rebuild queues every sparse tensor
    in a module-level list for this check, and only the check empties it (without it, each
    returned sparse tensor, and the mapping under it, would live as long as the process)."""
    utils = sys.modules.get("torch._utils")
    validate = getattr(utils, "_validate_loaded_sparse_tensors", None)
    if validate is not None and getattr(utils, "_sparse_tensors_to_validate", None):
        validate()
