"""The pickler that sends tensors' and arrays' bytes to the memfd (``shared_tensors.dumps`` pickles
with it): what each kind of object becomes in the stream, and the stand-ins the stream names.

Apart from the stream and the unpickler because it is the writing side's job alone: a reducer
decides, per object, whether its bytes go to the file (``tensor_file.Appender``), inline, or
through ``base``'s own pickling; ``shared_tensors`` reads back what they wrote.
"""
from __future__ import annotations

import ctypes
import functools
import logging
import pickle
import sys
from typing import Any

from . import pickling
from .tensor_file import Appender

logger = logging.getLogger("notebook_launch")

INLINE_LIMIT = 64 * 1024   # smaller storages travel inside the pickle stream


def _rebuild_storage(index: int, dtype: Any, place: Any = None) -> Any:
    """Stands in the pickle stream for a storage; only ``loads`` can rebuild it."""
    raise pickle.UnpicklingError("this pickle holds tensors in shared memory: load it with "
                                 "notebook_launch's shared_tensors.loads and the file it came with")


def _rebuild_array(place: Any, dtype: Any, shape: Any, order: str, writeable: bool = True) -> Any:
    """Stands in the pickle stream for a numpy array; only ``loads`` can rebuild it."""
    raise pickle.UnpicklingError("this pickle holds arrays in shared memory: load it with "
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
            reduced = reduce_shared(obj, self._file, self._indexes, getattr(self, "proto", pickle.HIGHEST_PROTOCOL))
            if reduced is not None:
                return reduced
            handle = pickling.reduce_handle(obj)   # an open file or socket is refused, not copied
            if handle is not NotImplemented:
                return handle
            code = pickling.reduce_code(obj)   # a function's code keeps the file it came from
            if code is not NotImplemented:
                return code
            parent = getattr(super(), "reducer_override", None)
            return parent(obj) if parent is not None else NotImplemented

    SharedTensorPickler.__qualname__ = f"SharedTensorPickler[{base.__qualname__}]"
    return SharedTensorPickler


def reduce_shared(obj: Any, file: Appender, indexes: dict, proto: int) -> Any:
    """How ``obj`` is pickled if it is a numpy array, a torch storage or a tensor torch would
    rebuild off the CPU; None: not one of those, or one pickled the usual way."""
    numpy = sys.modules.get("numpy")
    if numpy is not None and type(obj) is numpy.ndarray:
        reduced = reduce_array(file, numpy, obj)
        if reduced is not None:
            return reduced
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, (torch.storage.TypedStorage, torch.UntypedStorage)):
        reduced = reduce_storage(file, indexes, torch, obj)
        if reduced is not None:
            return reduced
    if torch is not None and isinstance(obj, torch.Tensor) and rebuilds_off_cpu(torch, obj):
        return cpu_copy(torch, obj).__reduce_ex__(proto)
    return None


def reduce_storage(file: Appender, indexes: dict, torch: Any, obj: Any) -> Any:
    """A storage as its index in this pickle (``indexes``: each storage is written once, so
    views and tied parameters come back shared) and its bytes: a place in the file, or inline."""
    if isinstance(obj, torch.storage.TypedStorage):
        dtype, untyped = obj.dtype, obj._untyped_storage
    else:
        dtype, untyped = None, obj
    if untyped.device.type == "meta":
        return None   # no bytes: torch's own reduction
    nbytes = untyped.nbytes()
    key = (str(untyped.device), untyped.data_ptr()) if nbytes else ("empty", id(untyped))
    index = indexes.get(key)
    if index is not None:
        return _rebuild_storage, (index, dtype)
    index = indexes[key] = len(indexes)
    if untyped.device.type != "cpu":
        untyped = untyped.cpu()
    place: Any = None
    if nbytes >= INLINE_LIMIT:
        place = file.append(_bytes_view(untyped, nbytes))
    if place is None:
        place = bytes(_bytes_view(untyped, nbytes)) if nbytes else b""
    return _rebuild_storage, (index, dtype, place)


def reduce_array(file: Appender, numpy: Any, array: Any) -> Any:
    """A big numpy array's bytes to the file, its dtype and shape in the stream; None:
    numpy's own pickling (small, object dtype, or no file). Each array is written once
    (pickle's memo sends the same array object twice as one)."""
    if array.nbytes < INLINE_LIMIT or array.dtype.hasobject or file.fd is None:
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
    place = file.append(memoryview(flat.view(numpy.uint8)))
    if place is None:
        return None
    return _rebuild_array, (place, array.dtype, array.shape, order, writeable)


def rebuilds_off_cpu(torch: Any, tensor: Any) -> bool:
    """torch would pickle ``tensor`` as a rebuild onto its own device, not through a storage
    (``Tensor._reduce_ex_internal``: XLA, MAIA, MTIA, a storage-less private backend): unpickled
    in the notebook, an XLA tensor would start the XLA runtime there, and a TorchTPU one ("tpu")
    TorchTPU's, whose client would take the TPU devices from the next launch's ranks: always
    copied. Storage-backed tensors (CUDA) need nothing here: their storages come back as CPU
    storages (``reduce_storage``)."""
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
