"""``find_executable_batch_size``: Accelerate's decorator, agreed on by every rank of the group.

Accelerate's decorator (accelerate/utils/memory.py) retries the wrapped function with a smaller
batch size when it runs out of memory, but each process alone: a rank that runs out of memory backs
off while its peers go on, and the group ends up waiting in collectives that no longer match (a
peer sits in DDP's backward all_reduce that the backing-off rank never joins). Lightning's finder
refuses several ranks for the same reason (Lightning-AI issue 19789).

Here, inside an initialized process group of more than one rank, each call is a series of
attempts, all ranks together:

1. Every rank runs the function with the same batch size.
2. A rank that runs out of memory writes its proposal (the next, smaller batch size) in the group's
   rendezvous store, then destroys its process group and frees it. Freeing it closes its gloo
   connections, and a peer blocked in a collective with it gets "Connection closed by peer" at
   once (checked on torch 2.13: ``destroy_process_group()`` alone, or gloo's ``abort()``/
   ``shutdown()``, leave the connections open while anything still references the group, and the
   peer waits for gloo's timeout; freeing the last reference is what closes them). So the failed
   attempt's frames are cleared, any DDP model still built on the dead group is disarmed
   (its reducer and group dropped), and functions whose default arguments captured the group
   get ``None`` (the default group) instead, before the group's last reference goes. Such
   defaults are common: ``torch.distributed.nn.functional`` declares ten functions with
   ``group=group.WORLD``, evaluated when it is first imported, and DDP's construction imports it;
   in a spawned rank that is inside the first attempt, while the group exists (a forked rank
   usually has it from the notebook, imported before any group, with ``None``). The
   ProcessGroup binding is not tracked by the garbage collector, so the tuples of defaults that
   hold it are not either, and ``gc.get_referrers`` does not see them.
3. A rank whose attempt fails otherwise looks in the store: if some rank reported out of memory in
   this attempt, its failure is that rank leaving (it frees its own group the same way, so ranks
   waiting on *it* fail in turn); if none did, the error is the user's and is raised as usual.
4. Every rank then writes how its attempt ended and waits for all the others (a barrier in the
   store, which outlives the process groups): the attempt's result is returned only when every rank
   finished it, so no rank goes on alone. Otherwise all take the smallest proposal, re-create the
   default process group (same backend, a fresh ``PrefixStore`` of the same store per attempt) and
   try again. Nothing of ours may hold the group across an attempt (the decorator keeps no
   reference to it): one reference left is enough to keep its connections open.

A reference we do not know of (the user's own container holding the group) still keeps the
group, and the peer then waits for the group's timeout; a warning in the rank's log says so.

Outside a process group (or with one rank) it is Accelerate's loop, in one process. torch is
imported only inside the functions: importing notebook_launch imports nothing heavy.
"""
from __future__ import annotations

import functools
import gc
import inspect
import itertools
import logging
import sys
import traceback
import types
import weakref
from datetime import timedelta
from typing import Any, Callable, Optional
from ..best_effort import best_effort

log = logging.getLogger("notebook_launch")

_OUT_OF_MEMORY_TEXTS = (
    " out of memory.",                                   # CUDA, HIP, XPU
    "MPS backend out of memory",
    "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.",
    "DefaultCPUAllocator: can't allocate memory",         # CPU
    "FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed",  # HPU
)
_calls = itertools.count()   # every rank decorates and calls in the same order: one key space per call


def should_reduce_batch_size(exception: BaseException) -> bool:
    """Accelerate's test (the same messages), plus Python's own ``MemoryError``: a rank whose
    address space or cgroup is full raises that from a plain allocation."""
    if isinstance(exception, MemoryError):
        return True
    if isinstance(exception, RuntimeError) and len(exception.args) == 1 and isinstance(exception.args[0], str):
        return any(text in exception.args[0] for text in _OUT_OF_MEMORY_TEXTS)
    return False


def find_executable_batch_size(function: Optional[Callable[..., Any]] = None, starting_batch_size: int = 128,
                               reduce_batch_size_fn: Optional[Callable[[], int]] = None) -> Any:
    """Call ``function(batch_size, *args, **kwargs)``, with a smaller batch size after each
    out-of-memory failure, the same on every rank (Accelerate's decorator, same signature).

    Inside a launch with a process group, a rank running out of memory makes every rank back off,
    and an attempt's result is returned only when every rank finished it; the next batch size is
    the smallest any rank proposed. ``reduce_batch_size_fn`` (no arguments, returns the next size)
    defaults to 90% of the current one, as in Accelerate. Use it as
    ``@find_executable_batch_size(starting_batch_size=64)`` on a function that builds (or
    ``prepare``s) its model inside, so that a failed attempt's model goes with it.
    """
    if function is None:
        return functools.partial(find_executable_batch_size, starting_batch_size=starting_batch_size,
                                 reduce_batch_size_fn=reduce_batch_size_fn)
    batch_size = starting_batch_size
    if reduce_batch_size_fn is None:
        def reduce_batch_size_fn() -> int:
            return int(batch_size * 0.9)

    def next_size() -> int:
        nonlocal batch_size
        assert reduce_batch_size_fn is not None
        batch_size = int(reduce_batch_size_fn())
        return batch_size

    def set_size(size: int) -> None:
        nonlocal batch_size
        batch_size = size

    @functools.wraps(function)
    def decorator(*args: Any, **kwargs: Any) -> Any:
        _check_arguments(function, args)
        _free_device_memory()
        if not _in_a_group():   # (holds no reference to the group: a failed attempt's must be freed)
            return _alone(function, args, kwargs, lambda: batch_size, next_size)
        return _together(function, args, kwargs, lambda: batch_size, next_size, set_size)

    return decorator


def _check_arguments(function: Callable[..., Any], args: tuple[Any, ...]) -> None:
    """Accelerate's guard: the batch size is passed by the decorator, not by the caller."""
    params = list(inspect.signature(function).parameters)
    if len(params) < len(args) + 1:
        given = ", ".join(f"{name}={value}" for name, value in zip(params[1:], args[1:]))
        raise TypeError(f"Batch size was passed into `{function.__name__}` as the first argument when called. "
                        f"Remove this as the decorator already does so: `{function.__name__}({given})`")


def _in_a_group() -> bool:
    """Whether a default process group of more than one rank is initialized."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return False
    return bool(dist.get_world_size() > 1)


def _alone(function: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
           current: Callable[[], int], next_size: Callable[[], int]) -> Any:
    """One process: Accelerate's loop."""
    while True:
        if current() <= 0:
            raise RuntimeError("No executable batch size found, reached zero.")
        try:
            return function(current(), *args, **kwargs)
        except Exception as error:
            if not should_reduce_batch_size(error):
                raise
            _forget(error)
        _free_device_memory()
        next_size()


def _together(function: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
              current: Callable[[], int], next_size: Callable[[], int], set_size: Callable[[int], None]) -> Any:
    """The attempts of the whole group (the module docstring says how they stay in step)."""
    import torch.distributed as dist
    from torch.distributed import PrefixStore

    c10d = dist.distributed_c10d
    store = c10d._get_default_store()   # outlives every group re-created below
    rank, world_size = dist.get_rank(), dist.get_world_size()
    backend = dist.get_backend()
    call = next(_calls)
    for attempt in itertools.count():
        if current() <= 0:
            raise RuntimeError("No executable batch size found, reached zero.")
        keys = PrefixStore(f"nl-bs/{call}/{attempt}/", store)
        outcome, result, user_error = _attempt(function, args, kwargs, current(), keys, next_size)
        if user_error is not None:
            keys.set(f"end/{rank}", "error")
            raise user_error
        keys.set(f"end/{rank}", outcome)
        ends = _wait_for_all(keys, rank, world_size)
        failed = [r for r, end in enumerate(ends) if end == "error"]
        if failed:
            _leave_group()
            raise RuntimeError(f"rank {failed[0]} failed with an error that is not out of memory while every "
                               f"rank tried batch size {current()}; its own traceback says why")
        proposals = [int(end.split()[1]) for end in ends if end.startswith("oom ")]
        if not proposals:
            return result
        result = None
        smallest = min(proposals)
        log.info("find_executable_batch_size: rank(s) %s ran out of memory at batch size %d; every rank "
                 "goes on with %d", [r for r, end in enumerate(ends) if end.startswith("oom ")], current(),
                 smallest)
        set_size(smallest)
        _leave_group()
        _free_device_memory()
        dist.init_process_group(backend, store=PrefixStore(f"nl-bs-group/{call}/{attempt + 1}", store),
                                rank=rank, world_size=world_size, timeout=_default_timeout(backend))
    raise AssertionError("unreachable")


def _attempt(function: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], size: int,
             keys: Any, next_size: Callable[[], int]) -> tuple[str, Any, Optional[BaseException]]:
    """Run one attempt on this rank: ("ok", result, None), ("oom N", None, None) with this rank's
    proposal N, ("peer", None, None) for a failure caused by another rank's backing off, or the
    user's own error to raise."""
    import torch.distributed as dist
    rank = dist.get_rank()
    try:
        return "ok", function(size, *args, **kwargs), None
    except Exception as error:   # why: the user's function failed: out of memory backs off, any other is reported
        if should_reduce_batch_size(error):
            proposal = next_size()
            keys.set(f"oom/{rank}", str(proposal))   # before leaving: a peer that fails looks here
            outcome = f"oom {proposal}"
        elif _someone_ran_out(keys, dist.get_world_size()):
            log.info("find_executable_batch_size: rank %d's attempt at batch size %d failed because another "
                     "rank ran out of memory (%s)", rank, size, error)
            outcome = "peer"
        else:
            return "error", None, error
        _forget(error)
    # out of the except block, where the exception (and through it the attempt's frames) is gone
    _leave_group()
    return outcome, None, None


def _someone_ran_out(keys: Any, world_size: int) -> bool:
    return any(keys.check([f"oom/{r}"]) for r in range(world_size))


def _wait_for_all(keys: Any, rank: int, world_size: int) -> list[str]:
    """Every rank's end of this attempt, in rank order (blocks until all wrote theirs)."""
    names = [f"end/{r}" for r in range(world_size)]
    keys.wait(names, timedelta(days=365))   # a rank that dies is the launcher's to report, not a timeout's
    ends = [keys.get(name).decode() for name in names]
    # Rank 0 hosts the store (torch's rule for MASTER_ADDR/MASTER_PORT): it must not go on (and
    # perhaps end its process) while another rank is still reading, so the others say they read.
    if rank == 0:
        keys.wait([f"read/{r}" for r in range(1, world_size)], timedelta(days=365))
    else:
        keys.set(f"read/{rank}", "1")
    return ends


def _forget(error: BaseException) -> None:
    """Clear the frames of a failed attempt's traceback (and of its causes): they hold its model,
    optimizer and batch, and through a DDP model the process group that must be freed."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if error.__traceback__ is not None:
            traceback.clear_frames(error.__traceback__)
            error.__traceback__ = None
        error = error.__cause__ or error.__context__  # type: ignore[assignment]


def _leave_group() -> None:
    """Destroy this rank's default group and free it now, so that its gloo connections close
    and peers blocked in a collective with this rank fail instead of waiting for the timeout.

    Order matters (rank/process_groups.py says why): a DDP Reducer must never be the last owner of
    a gloo group, so DDP models still on the group are disarmed while our own reference keeps the
    group, and that reference (whose destructor releases the GIL) goes last."""
    import torch.distributed as dist
    from . import process_groups
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
        _drop_references_to(group)
    del group
    process_groups.release_destroyed_groups()
    gc.collect()
    if gone() is not None:
        log.warning("find_executable_batch_size: the failed attempt's process group is still referenced (%s); "
                    "peers waiting in a collective with this rank wait for the process group's timeout",
                    ", ".join(type(r).__name__ for r in gc.get_referrers(gone()) if r is not None)[:200])


def _drop_references_to(group: Any) -> None:
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


def _default_timeout(backend: str) -> timedelta:
    import torch.distributed.distributed_c10d as c10d
    return c10d._get_default_timeout(c10d.Backend(backend))


def _free_device_memory() -> None:
    """gc, and the CUDA cache when CUDA is already in use (never the call that starts CUDA)."""
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
