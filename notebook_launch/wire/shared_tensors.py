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
"""
from __future__ import annotations

import ctypes
import errno
import functools
import io
import logging
import mmap
import os
import pickle
import sys
from collections.abc import Callable
from typing import Any

from . import pickling
from ..channels import create_memfd

# A memfd for tensor bytes is a channel (``channels.pipes``): one maker for a rank's result file
# and the files of calls and jobs.
create_file = create_memfd
logger = logging.getLogger("notebook_launch")

INLINE_LIMIT = 64 * 1024   # smaller storages travel inside the pickle stream
# Storages one load maps one by one (each freed with its tensor); the rest share one mapping.
# Each mapping counts against vm.max_map_count (65530 by default), so a result of many
# thousand tensors must not take one each.
MAPPINGS_PER_LOAD = 256
_PAGE = mmap.ALLOCATIONGRANULARITY
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


def _align(offset: int) -> int:
    return -(-offset // _PAGE) * _PAGE


def _rebuild_storage(index: int, dtype: Any, place: Any = None) -> Any:
    """Stands in the pickle stream for a storage; only ``loads`` can rebuild it."""
    raise pickle.UnpicklingError("this pickle holds tensors in shared memory: load it with "
                                 "notebook_launch's shared_tensors.loads and the file it came with")


@functools.lru_cache(maxsize=None)
def pickler_class(base: type) -> type:
    """``base`` (a pickle.Pickler subclass such as cloudpickle's) that sends storages to a memfd,
    and refuses open files and sockets (``pickling.reduce_handle``) whatever ``base`` would do.

    A ``reducer_override`` rather than a ``persistent_id``: the pickler calls it only
    for objects of non-builtin types, so a result of a million ints costs no more
    than before. Other objects go to ``base``'s own ``reducer_override`` (cloudpickle's
    by-value functions and classes, or a runner's ``__main__`` handling)."""

    class SharedTensorPickler(base):
        def __init__(self, file: Any, fd: "int | None | Appender", **kwargs: Any) -> None:
            super().__init__(file, **kwargs)
            self._file = fd if isinstance(fd, Appender) else Appender(fd)
            self._indexes: dict = {}

        def reducer_override(self, obj: Any) -> Any:
            numpy = sys.modules.get("numpy")
            if numpy is not None and type(obj) is numpy.ndarray:
                reduced = self._reduce_array(numpy, obj)
                if reduced is not None:
                    return reduced
            torch = sys.modules.get("torch")
            if torch is not None and isinstance(obj, (torch.storage.TypedStorage, torch.UntypedStorage)):
                reduced = self._reduce_storage(torch, obj)
                if reduced is not None:
                    return reduced
            if torch is not None and isinstance(obj, torch.Tensor) and rebuilds_off_cpu(torch, obj):
                return cpu_copy(torch, obj).__reduce_ex__(getattr(self, "proto", pickle.HIGHEST_PROTOCOL))
            handle = pickling.reduce_handle(obj)   # an open file or socket is refused, not copied
            if handle is not NotImplemented:
                return handle
            code = pickling.reduce_code(obj)   # a function's code keeps the file it came from
            if code is not NotImplemented:
                return code
            parent = getattr(super(), "reducer_override", None)
            return parent(obj) if parent is not None else NotImplemented

        def _reduce_storage(self, torch: Any, obj: Any) -> Any:
            if isinstance(obj, torch.storage.TypedStorage):
                dtype, untyped = obj.dtype, obj._untyped_storage
            else:
                dtype, untyped = None, obj
            if untyped.device.type == "meta":
                return None   # no bytes: torch's own reduction
            nbytes = untyped.nbytes()
            key = (str(untyped.device), untyped.data_ptr()) if nbytes else ("empty", id(untyped))
            index = self._indexes.get(key)
            if index is not None:
                return _rebuild_storage, (index, dtype)
            index = self._indexes[key] = len(self._indexes)
            if untyped.device.type != "cpu":
                untyped = untyped.cpu()
            place: Any = None
            if nbytes >= INLINE_LIMIT:
                place = self._file.append(_bytes_view(untyped, nbytes))
            if place is None:
                place = bytes(_bytes_view(untyped, nbytes)) if nbytes else b""
            return _rebuild_storage, (index, dtype, place)

        def _reduce_array(self, numpy: Any, array: Any) -> Any:
            """A big numpy array's bytes to the file, its dtype and shape in the stream; None:
            numpy's own pickling (small, object dtype, or no file). Each array is written once
            (pickle's memo sends the same array object twice as one)."""
            if array.nbytes < INLINE_LIMIT or array.dtype.hasobject or self._file.fd is None:
                return None
            # As numpy pickles an array: a contiguous one keeps its order and read-only flag,
            # any other comes back as a writable C-contiguous copy
            writeable = bool(array.flags.writeable)
            if array.flags.c_contiguous:
                order, flat = "C", array.reshape(-1)
            elif array.flags.f_contiguous:
                order, flat = "F", array.T.reshape(-1)
            else:
                order, flat, writeable = "C", numpy.ascontiguousarray(array).reshape(-1), True
            place = self._file.append(memoryview(flat.view(numpy.uint8)))
            if place is None:
                return None
            return _rebuild_array, (place, array.dtype, array.shape, order, writeable)

    SharedTensorPickler.__qualname__ = f"SharedTensorPickler[{base.__qualname__}]"
    return SharedTensorPickler


def _rebuild_array(place: Any, dtype: Any, shape: Any, order: str, writeable: bool = True) -> Any:
    """Stands in the pickle stream for a numpy array; only ``loads`` can rebuild it."""
    raise pickle.UnpicklingError("this pickle holds arrays in shared memory: load it with "
                                 "notebook_launch's shared_tensors.loads and the file it came with")


class Appender:
    """The memfd a pickle's big parts (storages, arrays, pieces of the stream) are appended to,
    each at a page boundary so the reader can map it. None once there is no file: where memfds
    do not exist, or once the file reached RLIMIT_FSIZE (``ulimit -f`` caps a memfd too); the
    parts then travel in the stream."""

    def __init__(self, fd: "int | None | Callable[[], int | None]") -> None:
        """``fd``: the file, or a function that gives one (a launch's, or a fresh one), called the first time
        a part goes to the file: a pickle with nothing big (a call on persistent ranks and its
        result, most of the time) then makes no memfd at all (issue 45: one per call each way)."""
        self._make: Callable[[], int | None] | None = None
        self._fd: int | None = None
        if callable(fd):
            self._make, self.size = fd, 0
        else:
            self._fd = fd
            self.size = _align(os.fstat(fd).st_size) if fd is not None else 0

    @property
    def fd(self) -> int | None:
        if self._make is not None:
            make, self._make = self._make, None
            self._fd = make()
            self.size = _align(os.fstat(self._fd).st_size) if self._fd is not None else 0
        return self._fd

    @fd.setter
    def fd(self, fd: int | None) -> None:
        self._make, self._fd = None, fd

    def append(self, view: memoryview) -> tuple[int, int] | None:
        """(offset, length) of ``view``'s bytes written to the file, or None: keep them inline."""
        if self.fd is None:
            return None
        nbytes = view.nbytes
        try:
            _write_at(self.fd, view, self.size)
        except OSError as exc:
            if exc.errno != errno.EFBIG:
                raise   # out of memory: the caller says so
            logger.debug("the result file reached the file size limit; the rest goes inline")
            self.fd = None
            return None
        place = (self.size, nbytes)
        self.size = _align(self.size + nbytes)
        return place


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
            _punch_hole(self._fd, *self._piece)
        self._piece = None

    def close(self) -> None:
        self._release()
        super().close()


def rebuilds_off_cpu(torch: Any, tensor: Any) -> bool:
    """torch would pickle ``tensor`` as a rebuild onto its own device, not through a storage
    (``Tensor._reduce_ex_internal``: XLA, MAIA, MTIA, a storage-less private backend): unpickled
    in the notebook, an XLA tensor would start the XLA runtime there, and a TorchTPU one ("tpu")
    TorchTPU's, whose client would take the TPU devices from the next launch's ranks: always
    copied. Storage-backed tensors (CUDA) need nothing here: their storages come back as CPU
    storages (``_reduce_storage``)."""
    device = tensor.device.type
    if device in ("cpu", "meta"):
        return False
    if device in ("xla", "maia", "mtia", "tpu"):
        return True
    try:
        return not torch._C._has_storage(tensor)
    except Exception:   # why: a tensor that cannot say is taken as having a storage, and sent as one
        logger.debug("cannot tell whether a %s tensor has a storage", device, exc_info=True)
        return False


def cpu_copy(torch: Any, tensor: Any) -> Any:
    """``tensor`` on the CPU: a parameter stays a parameter, ``requires_grad`` is kept (a
    tensor that was not a leaf comes back as a leaf, detached from the rank's graph)."""
    copy = tensor.detach().cpu()
    if isinstance(tensor, torch.nn.Parameter):
        return torch.nn.Parameter(copy, requires_grad=tensor.requires_grad)
    if tensor.requires_grad:   # only floating and complex tensors can, so this cannot fail
        copy.requires_grad_(True)
    return copy


def _bytes_view(untyped: Any, nbytes: int) -> memoryview:
    """The storage's bytes, without copying them (CPU storages only)."""
    return memoryview((ctypes.c_char * nbytes).from_address(untyped.data_ptr())).cast("B")


def _write_at(fd: int, view: memoryview, offset: int) -> None:
    done = 0
    while done < len(view):   # one pwrite moves at most ~2 GiB
        done += os.pwrite(fd, view[done:], offset + done)


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
        if module == __name__ and name == "_rebuild_storage":
            return self._storage
        if module == __name__ and name == "_rebuild_array":
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
                mapping = _map_private(self._fd, offset, nbytes)
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
                self._rest = (offset, _map_private(self._fd, offset, end - offset))
            except OSError as exc:
                return _read_region(self._fd, offset, nbytes, exc)
        start, mapping = self._rest
        return memoryview(mapping).cast("B")[offset - start:offset - start + nbytes]


def _read_region(fd: int, offset: int, nbytes: int, cause: OSError) -> bytearray:
    """The region's bytes copied from ``fd`` into ordinary memory: the fallback when a process
    cannot map one more region (each mapped tensor or array is one of the ``vm.max_map_count``
    mappings a process may hold, 65530 by default). Raises an OSError naming both limits if memory is short too."""
    try:
        region = bytearray(nbytes)
        view = memoryview(region)
        done = 0
        while done < nbytes:
            read = os.preadv(fd, [view[done:]], offset + done)
            if read <= 0:
                raise OSError(f"the result file ended {nbytes - done} bytes early")
            done += read
        return region
    except (OSError, MemoryError) as exc:
        raise OSError(cause.errno, (
            f"a returned tensor or array of {nbytes} bytes could neither be mapped ({cause.strerror or cause}) nor "
            f"copied into memory ({exc}). Mapping fails when the process holds vm.max_map_count mappings "
            f"(see /proc/sys/vm/max_map_count; raise it with `sysctl -w vm.max_map_count=262144`) or is "
            f"out of address space (ulimit -v); copying fails when memory is short. Return fewer, larger "
            f"tensors or arrays (concatenate them, or a flattened state_dict), or free memory.")) from exc


def _libc() -> Any:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int64]
    libc.munmap.restype = ctypes.c_int
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.fallocate.restype = ctypes.c_int
    libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    return libc


_LIBC = _libc() if hasattr(os, "memfd_create") else None
_MAP_FAILED = ctypes.c_void_p(-1).value
_FALLOC_FL_KEEP_SIZE, _FALLOC_FL_PUNCH_HOLE = 0x01, 0x02   # linux/falloc.h


def _map_private(fd: int, offset: int, nbytes: int) -> Any:
    """``nbytes`` of ``fd`` from ``offset``, mapped copy-on-write (MAP_PRIVATE): no copy now,
    and writes stay private. A buffer object that unmaps itself when the last user (the
    tensor's storage) lets go. Not Python's ``mmap.mmap``: it keeps a duplicate of the fd
    open for as long as the mapping lives, one per tensor."""
    libc: Any = _LIBC
    assert libc is not None, "memfds exist only where libc does"
    address = libc.mmap(None, nbytes, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE, fd, offset)
    if address in (None, _MAP_FAILED):
        errno = ctypes.get_errno()
        raise OSError(errno, f"mapping {nbytes} bytes of the tensor file failed: {os.strerror(errno)}")

    class Mapping(ctypes.c_uint8 * nbytes):  # type: ignore[misc]
        def __del__(self) -> None:
            libc.munmap(address, nbytes)

    return Mapping.from_address(address)


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


def _punch_hole(fd: int, offset: int, nbytes: int) -> None:
    """Free the file's pages in [offset, offset + nbytes) (its size stays: nothing mapped can
    turn into SIGBUS). A courtesy: where it fails, the pages go when the file does."""
    libc: Any = _LIBC
    if libc is None or not nbytes:
        return
    if libc.fallocate(fd, _FALLOC_FL_KEEP_SIZE | _FALLOC_FL_PUNCH_HOLE, offset, _align(nbytes)) != 0:
        logger.debug("freeing the result stream's pages failed: %s", os.strerror(ctypes.get_errno()))


def _validate_sparse_tensors() -> None:
    """What torch.load does after unpickling: torch's sparse rebuild queues every sparse tensor
    in a module-level list for this check, and only the check empties it (without it, each
    returned sparse tensor, and the mapping under it, would live as long as the process)."""
    utils = sys.modules.get("torch._utils")
    validate = getattr(utils, "_validate_loaded_sparse_tensors", None)
    if validate is not None and getattr(utils, "_sparse_tensors_to_validate", None):
        validate()
