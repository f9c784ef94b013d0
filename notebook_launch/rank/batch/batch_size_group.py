"""How a failed attempt of ``find_executable_batch_size`` lets go of its process group (see
``batch_size``'s docstring for why every reference must go): its frames cleared, its DDP models
disarmed, function defaults that captured the group reset, and the group freed, so that its gloo
connections close and peers blocked in a collective with this rank fail at once."""
from __future__ import annotations

import gc
import logging
import sys
import traceback
import types
import weakref
from datetime import timedelta
from typing import Any

from ...errors.best_effort import best_effort

log = logging.getLogger("notebook_launch")


def forget(error: BaseException) -> None:
    """Clear the frames of a failed attempt's traceback (and of its causes): they hold its model,
    optimizer and batch, and through a DDP model the process group that must be freed."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if error.__traceback__ is not None:
            traceback.clear_frames(error.__traceback__)
            error.__traceback__ = None
        error = error.__cause__ or error.__context__  # type: ignore[assignment]


def leave_group() -> None:
    """Destroy this rank's default group and free it now, so that its gloo connections close
    and peers blocked in a collective with this rank fail instead of waiting for the timeout.

    Order matters (rank/group/process_groups.py says why): a DDP Reducer must never be the last owner of
    a gloo group, so DDP models still on the group are disarmed while our own reference keeps the
    group, and that reference (whose destructor releases the GIL) goes last."""
    import torch.distributed as dist
    from ..group import process_groups
    if not dist.is_initialized():
        return
    group = dist.distributed_c10d._get_default_group()
    gone = weakref.ref(group)
    backend = dist.get_backend()
    if backend == "nccl" and hasattr(group, "abort"):
        with best_effort("abort of the NCCL group failed"):
            group.abort()   # NCCL: peers' kernels waiting on this rank are released only by an abort
    dist.destroy_process_group()
    gc.collect()
    if gone() is not None:
        drop_references_to(group)
    del group
    process_groups.release_destroyed_groups()
    gc.collect()
    if gone() is not None:
        log.warning("find_executable_batch_size: the failed attempt's process group is still referenced (%s); "
                    "peers waiting in a collective with this rank wait for the process group's timeout",
                    ", ".join(type(r).__name__ for r in gc.get_referrers(gone()) if r is not None)[:200])


def drop_references_to(group: Any) -> None:
    """What of the failed attempt still holds its group, which only that attempt used: DDP
    models (in an Accelerator's list, a global) lose their reducer and group; functions whose
    default arguments were evaluated while the group existed (``group=dist.group.WORLD``) get
    ``None`` in its place, which means the default group, as if defined before any group."""
    from torch.nn.parallel import DistributedDataParallel
    for obj in gc.get_objects():
        if isinstance(obj, DistributedDataParallel) and getattr(obj, "process_group", None) is group:
            for name in ("reducer", "logger", "process_group"):
                obj.__dict__.pop(name, None)
        elif isinstance(obj, types.FunctionType):
            defaults = obj.__defaults__
            if defaults is not None and any(value is group for value in defaults):
                obj.__defaults__ = tuple(None if value is group else value for value in defaults)
            keyword_defaults = obj.__kwdefaults__
            if keyword_defaults is not None:
                for name, value in keyword_defaults.items():
                    if value is group:
                        keyword_defaults[name] = None


def default_timeout(backend: str) -> timedelta:
    import torch.distributed.distributed_c10d as c10d
    return c10d._get_default_timeout(c10d.Backend(backend))


def free_device_memory() -> None:
    """gc, and the CUDA cache when CUDA is already in use (never the call that starts CUDA)."""
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
