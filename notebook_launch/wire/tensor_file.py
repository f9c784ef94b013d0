"""The memfd a pickle's big parts go to (``shared_tensors``): appending them page-aligned, mapping
them back copy-on-write, reading them when no mapping is left, freeing a read piece's pages.

Apart from the pickler and unpickler, because it is a job of its own: the file knows offsets and
bytes, never tensors or pickles (``tensor_reducers`` decides what goes to it, ``shared_tensors``
reads it back).
"""
from __future__ import annotations

import ctypes
import errno
import logging
import mmap
import os
from collections.abc import Callable
from typing import Any

from ..channels import create_memfd

# A memfd for tensor bytes is a channel (``channels.pipes``): one maker for a rank's result file
# and the files of calls and jobs.
create_file = create_memfd
logger = logging.getLogger("notebook_launch")

_PAGE = mmap.ALLOCATIONGRANULARITY


def align(offset: int) -> int:
    """``offset`` rounded up to a page boundary (where the next part may be mapped from)."""
    return -(-offset // _PAGE) * _PAGE


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
            self.size = align(os.fstat(fd).st_size) if fd is not None else 0

    @property
    def fd(self) -> int | None:
        if self._make is not None:
            make, self._make = self._make, None
            self._fd = make()
            self.size = align(os.fstat(self._fd).st_size) if self._fd is not None else 0
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
        self.size = align(self.size + nbytes)
        return place


def _write_at(fd: int, view: memoryview, offset: int) -> None:
    done = 0
    while done < len(view):   # one pwrite moves at most ~2 GiB
        done += os.pwrite(fd, view[done:], offset + done)


def read_region(fd: int, offset: int, nbytes: int, cause: OSError) -> bytearray:
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


def map_private(fd: int, offset: int, nbytes: int) -> Any:
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


def punch_hole(fd: int, offset: int, nbytes: int) -> None:
    """Free the file's pages in [offset, offset + nbytes) (its size stays: nothing mapped can
    turn into SIGBUS). A courtesy: where it fails, the pages go when the file does."""
    libc: Any = _LIBC
    if libc is None or not nbytes:
        return
    if libc.fallocate(fd, _FALLOC_FL_KEEP_SIZE | _FALLOC_FL_PUNCH_HOLE, offset, align(nbytes)) != 0:
        logger.debug("freeing the result stream's pages failed: %s", os.strerror(ctypes.get_errno()))
