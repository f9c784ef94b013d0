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
"""
from __future__ import annotations

import ctypes
import errno
import io
import logging
import mmap
import os
import pickle
import sys
from typing import Any

from . import pickling
from .channels import create_memfd

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


def _align(offset: int) -> int:
    return -(-offset // _PAGE) * _PAGE


def _rebuild_storage(index: int, dtype: Any, place: Any = None) -> Any:
    """Stands in the pickle stream for a storage; only ``loads`` can rebuild it."""
    raise pickle.UnpicklingError("this pickle holds tensors in shared memory: load it with "
                                 "notebook_launch's shared_tensors.loads and the file it came with")


def pickler_class(base: type) -> type:
    """``base`` (a pickle.Pickler subclass such as cloudpickle's) that sends storages to a memfd,
    and refuses open files and sockets (``pickling.reduce_handle``) whatever ``base`` would do.

    A ``reducer_override`` rather than a ``persistent_id``: the pickler calls it only
    for objects of non-builtin types, so a result of a million ints costs no more
    than before. Other objects go to ``base``'s own ``reducer_override`` (cloudpickle's
    by-value functions and classes, or a runner's ``__main__`` handling)."""

    class SharedTensorPickler(base):
        def __init__(self, file: Any, fd: int | None, **kwargs: Any) -> None:
            super().__init__(file, **kwargs)
            self._fd = fd
            self._size = _align(os.fstat(fd).st_size) if fd is not None else 0
            self._indexes: dict = {}

        def reducer_override(self, obj: Any) -> Any:
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
            if nbytes >= INLINE_LIMIT and self._fd is not None:
                try:
                    _write_at(self._fd, _bytes_view(untyped, nbytes), self._size)
                    place = (self._size, nbytes)
                    self._size = _align(self._size + nbytes)
                except OSError as exc:
                    if exc.errno != errno.EFBIG:
                        raise   # out of memory: the caller says so
                    # RLIMIT_FSIZE (ulimit -f) caps the memfd too: the rest travel in the stream
                    logger.debug("the tensor file reached the file size limit; tensors go inline")
                    self._fd = None
            if place is None:
                place = bytes(_bytes_view(untyped, nbytes)) if nbytes else b""
            return _rebuild_storage, (index, dtype, place)

    SharedTensorPickler.__qualname__ = f"SharedTensorPickler[{base.__qualname__}]"
    return SharedTensorPickler


def rebuilds_off_cpu(torch: Any, tensor: Any) -> bool:
    """torch would pickle ``tensor`` as a rebuild onto its own device, not through a storage
    (``Tensor._reduce_ex_internal``: XLA, MAIA, MTIA, a storage-less private backend): unpickled
    in the notebook, an XLA tensor would start the XLA runtime there. Storage-backed tensors
    (CUDA) need nothing here: their storages come back as CPU storages (``_reduce_storage``)."""
    device = tensor.device.type
    if device in ("cpu", "meta"):
        return False
    if device in ("xla", "maia", "mtia"):
        return True
    try:
        return not torch._C._has_storage(tensor)
    except Exception:
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


def dumps(value: Any, fd: int | None, base: type | None = None) -> bytes:
    """Pickle ``value``; big storages' bytes go to ``fd`` (appended), the rest in the returned bytes."""
    if base is None:
        import cloudpickle
        base = cloudpickle.Pickler
    stream = io.BytesIO()
    pickler_class(base)(stream, fd, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    return stream.getvalue()


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
        return super().find_class(module, name)

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
        if self._fd is None:
            raise pickle.UnpicklingError("this pickle holds tensors in a shared memory file that was not passed")
        offset, nbytes = place
        if self._rest is None and self._mapped < MAPPINGS_PER_LOAD:
            try:
                mapping = _map_private(self._fd, offset, nbytes)
                self._mapped += 1
                return torch.frombuffer(mapping, dtype=torch.uint8).untyped_storage()
            except OSError as exc:   # out of mappings (vm.max_map_count) or address space
                logger.debug("mapping a tensor failed (%s); mapping the rest of the file at once", exc)
        return self._from_rest(torch, offset, nbytes)

    def _from_rest(self, torch: Any, offset: int, nbytes: int) -> Any:
        """The storage as a slice of one mapping of the rest of the file (storages come in file
        order): past MAPPINGS_PER_LOAD tensors, or when no single mapping is left, one region
        serves them all; it is unmapped when the last of them is freed. Failing that, a copy."""
        assert self._fd is not None
        if self._rest is None or offset < self._rest[0]:
            end = os.fstat(self._fd).st_size
            try:
                self._rest = (offset, _map_private(self._fd, offset, end - offset))
            except OSError as exc:
                return _read_storage(torch, self._fd, offset, nbytes, exc)
        start, mapping = self._rest
        view = memoryview(mapping).cast("B")[offset - start:offset - start + nbytes]
        return torch.frombuffer(view, dtype=torch.uint8).untyped_storage()


def _read_storage(torch: Any, fd: int, offset: int, nbytes: int, cause: OSError) -> Any:
    """The storage's bytes copied from ``fd`` into ordinary memory: the fallback when a process
    cannot map one more region (each mapped tensor is one of the ``vm.max_map_count`` mappings a
    process may hold, 65530 by default). Raises an OSError naming both limits if memory is short too."""
    try:
        storage = torch.UntypedStorage(nbytes)
        view = _bytes_view(storage, nbytes)
        done = 0
        while done < nbytes:
            read = os.preadv(fd, [view[done:]], offset + done)
            if read <= 0:
                raise OSError(f"the tensor file ended {nbytes - done} bytes early")
            done += read
        return storage
    except (OSError, RuntimeError) as exc:
        raise OSError(cause.errno, (
            f"a returned tensor of {nbytes} bytes could neither be mapped ({cause.strerror or cause}) nor "
            f"copied into memory ({exc}). Mapping fails when the process holds vm.max_map_count mappings "
            f"(see /proc/sys/vm/max_map_count; raise it with `sysctl -w vm.max_map_count=262144`) or is "
            f"out of address space (ulimit -v); copying fails when memory is short. Return fewer, larger "
            f"tensors (torch.cat them, or a flattened state_dict), or free memory.")) from exc


def _libc() -> Any:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int64]
    libc.munmap.restype = ctypes.c_int
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return libc


_LIBC = _libc() if hasattr(os, "memfd_create") else None
_MAP_FAILED = ctypes.c_void_p(-1).value


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


def loads(data: bytes, fd: int | None) -> Any:
    """Unpickle what ``dumps`` wrote; tensors map ``fd``'s pages (the fd may be closed afterwards)."""
    unpickler = _Unpickler(io.BytesIO(data), fd)
    try:
        value = unpickler.load()
        _validate_sparse_tensors()
        return value
    finally:   # its memo holds a bound method of itself: without this, the storages it
        unpickler.memo.clear()   # kept would wait for the garbage collector to be unmapped
        unpickler._storages.clear()
        unpickler._rest = None


def _validate_sparse_tensors() -> None:
    """What torch.load does after unpickling: torch's sparse rebuild queues every sparse tensor
    in a module-level list for this check, and only the check empties it (without it, each
    returned sparse tensor, and the mapping under it, would live as long as the process)."""
    utils = sys.modules.get("torch._utils")
    validate = getattr(utils, "_validate_loaded_sparse_tensors", None)
    if validate is not None and getattr(utils, "_sparse_tensors_to_validate", None):
        validate()
