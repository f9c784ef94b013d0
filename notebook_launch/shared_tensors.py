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
"""
from __future__ import annotations

import ctypes
import fcntl
import io
import logging
import mmap
import os
import pickle
import sys
from typing import Any

from . import pickling

logger = logging.getLogger("notebook_launch")

INLINE_LIMIT = 64 * 1024   # smaller storages travel inside the pickle stream
_PAGE = mmap.ALLOCATIONGRANULARITY
_MEMFD_NAME = "notebook_launch-tensors"


def create_file() -> int | None:
    """A new memfd for tensor bytes, sealed against shrinking; None where memfds do not exist."""
    memfd_create = getattr(os, "memfd_create", None)
    if memfd_create is None:
        return None
    try:
        fd = memfd_create(_MEMFD_NAME, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    except OSError as exc:   # e.g. a seccomp profile that forbids it
        logger.debug("memfd_create failed (%s): tensors travel inside the pickle stream", exc)
        return None
    try:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
    except (OSError, AttributeError) as exc:
        logger.debug("could not seal the tensor memfd against shrinking: %s", exc)
    return fd


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
            if nbytes >= INLINE_LIMIT and self._fd is not None:
                place: Any = (self._size, nbytes)
                _write_at(self._fd, _bytes_view(untyped, nbytes), self._size)
                self._size = _align(self._size + nbytes)
            else:
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

    def find_class(self, module: str, name: str) -> Any:
        if module == __name__ and name == "_rebuild_storage":
            return self._storage
        return super().find_class(module, name)

    def _storage(self, index: int, dtype: Any, place: Any = None) -> Any:
        import torch
        untyped = self._storages.get(index)
        if untyped is None:
            untyped = self._storages[index] = self._load(torch, place)
        if dtype is None:
            return untyped
        return torch.storage.TypedStorage(wrap_storage=untyped, dtype=dtype, _internal=True)

    def _load(self, torch: Any, place: Any) -> Any:
        if isinstance(place, bytes):
            return torch.UntypedStorage.from_buffer(place, dtype=torch.uint8) if place else torch.UntypedStorage(0)
        if self._fd is None:
            raise pickle.UnpicklingError("this pickle holds tensors in a shared memory file that was not passed")
        offset, nbytes = place
        return torch.frombuffer(_map_private(self._fd, offset, nbytes), dtype=torch.uint8).untyped_storage()


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
        return unpickler.load()
    finally:   # its memo holds a bound method of itself: without this, the storages it
        unpickler.memo.clear()   # kept would wait for the garbage collector to be unmapped
        unpickler._storages.clear()
