"""``find_executable_batch_size``: Accelerate's decorator, agreed on by every rank of the group.

Accelerate's decorator (accelerate/utils/memory.py) retries the wrapped function with a smaller
batch size when it runs out of memory, but each process alone: a rank that runs out of memory backs
off while its peers go on, and the group ends up waiting in collectives that no longer match (a
peer sits in DDP's backward all_reduce that the backing-off rank never joins). Lightning's finder
refuses several ranks for the same reason (Lightning-AI issue 19789).

Who is in a call: a call may be made on every rank or on some only (an evaluation under
``if rank == 0:``), and no rank can tell a peer that is late from one that will never call. So no
rank ever waits for a peer that has not called (``batch_size_call`` keeps who joined each call in
the rendezvous store): a call on some ranks only backs off on each of them alone, as
Accelerate's does, and returns at once. Once every rank of the group has joined the call (a
function with a collective, DDP's construction or an all_reduce, has every rank in before any
rank finishes an attempt), the ranks agree as below; a rank that ran out of memory before any
peer had called moves the call on to the next size, where a late peer starts. A call that ran
without some ranks (a function with no collective at all; a rank out of memory before its first
collective while only some peers had joined, with 3 ranks or more) is closed: each rank goes on
alone, but from the call's lowest size in the store (the smallest any rank of it ended at or
backed off to; ``_alone``), and a rank whose attempt fit above it runs again at it, so the ranks
end at one size. Not when a rank calling after the others returned runs out of memory below
their size: it ends smaller (they cannot be called back). A collective at the top of the function
(a barrier) makes every call the whole group's. Ranks must then
start from the same ``starting_batch_size``: different ones (``[128, 100]``) raise a
``ValueError`` naming each rank's, on every rank, rather than one size chosen silently, since
each rank's batch is the user's stated share of the global batch and a rank-local start (free
memory) is usually a mistake the user wants to hear of. A second call (or a call of the same
function from another line) is a new agreement; a nested call is one of its own.

Every rank of the group in the call, each call is a series of attempts, all ranks together:

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
   waiting on *it* fail in turn); if none did, the error is the user's: the rank writes it in the
   store and raises it at once (its process ending releases peers in a collective with it, and
   a launch names it as the failing rank); each peer, at the end of its attempt, raises a
   ``RuntimeError`` naming that rank and its error instead of waiting (also when the failing
   rank caught its error and went on).
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

What the user sees of an error raised inside: their own frames. The decorator's frame sets
``__tracebackhide__`` (IPython and pytest leave it out, and so does a rank's reported
traceback, ``protocol.error_payload``), and the frames of this module and its two helpers
(``batch_size_call``, ``batch_size_group``) are cut out of the error's traceback before it
leaves the decorator.
"""
from __future__ import annotations

import functools
import inspect
import logging
import sys
import time
import types
from typing import Any, Callable, Optional, Union

from .batch_size_call import (CLOSED, FAILED, CallRecord, Phase, call_key, peer_failed, wait_for_ends,
                              wait_for_reads)
from .batch_size_group import default_timeout, forget, free_device_memory, leave_group

log = logging.getLogger("notebook_launch")

_OUT_OF_MEMORY_TEXTS = (
    " out of memory.",                                   # CUDA, HIP, XPU
    "MPS backend out of memory",
    "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.",
    "DefaultCPUAllocator: can't allocate memory",         # CPU
    "FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed",  # HPU
)
Ran = tuple[str, Any, Optional[BaseException]]   # ("ok", result, None), ("oom", None, None), ("error", None, error)



FOLLOW_ON_DELAY = 2.0   # seconds a peer waits before raising the failed rank's error as its own


def follow_on(text: str) -> RuntimeError:
    """The error a peer raises when another rank failed inside the call, after FOLLOW_ON_DELAY: the
    failed rank's own error (its traceback) then reaches the notebook first and the launch stops this
    rank, instead of naming the peer's follow-on error (once in CI it was); a rank that caught its
    error leaves its peers raising this after the delay."""
    time.sleep(FOLLOW_ON_DELAY)
    return RuntimeError(text)

def should_reduce_batch_size(exception: BaseException) -> bool:
    """Accelerate's test (the same messages), plus Python's own ``MemoryError``: a rank whose
    address space or cgroup is full raises that from a plain allocation."""
    if isinstance(exception, MemoryError):
        return True
    if isinstance(exception, RuntimeError) and len(exception.args) == 1 and isinstance(exception.args[0], str):
        return any(text in exception.args[0] for text in _OUT_OF_MEMORY_TEXTS)
    return False


class _Sizes:
    """The decorated function's batch size: kept from call to call, as Accelerate's decorator does."""

    def __init__(self, start: int, reduce: Optional[Callable[[], int]]) -> None:
        self.size = start
        self.reduce = reduce if reduce is not None else (lambda: int(self.size * 0.9))

    def next(self) -> int:
        self.size = int(self.reduce())
        return self.size


def find_executable_batch_size(function: Optional[Callable[..., Any]] = None, starting_batch_size: int = 128,
                               reduce_batch_size_fn: Optional[Callable[[], int]] = None) -> Any:
    """Call ``function(batch_size, *args, **kwargs)``, with a smaller batch size after each
    out-of-memory failure, the same on every rank (Accelerate's decorator, same signature).

    Called on every rank of a launch with a process group, a rank running out of memory makes
    every rank back off, and an attempt's result is returned only when every rank finished it;
    the next batch size is the smallest any rank proposed, and every rank must start from the
    same ``starting_batch_size``. Called on some ranks only (an evaluation under
    ``if rank == 0:``), each of them backs off alone, as Accelerate's does, and never waits for
    the others. ``reduce_batch_size_fn`` (no arguments, returns the next size) defaults to 90%
    of the current one, as in Accelerate. Use it as ``@find_executable_batch_size(starting_batch_size=64)``
    on a function that builds (or ``prepare``s) its model inside, so that a failed attempt's model
    goes with it.
    """
    if function is None:
        return functools.partial(find_executable_batch_size, starting_batch_size=starting_batch_size,
                                 reduce_batch_size_fn=reduce_batch_size_fn)
    sizes = _Sizes(starting_batch_size, reduce_batch_size_fn)

    @functools.wraps(function)
    def decorator(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # noqa: F841  (IPython, pytest and a rank's reported traceback leave it out)
        try:
            _check_arguments(function, args)
            free_device_memory()
            if not _in_a_group():   # (holds no reference to the group: a failed attempt's must be freed)
                return _alone(function, args, kwargs, sizes)
            return _in_the_group(function, args, kwargs, sizes, sys._getframe(1))
        except BaseException as error:   # why: the user sees their frames, not ours, whatever was raised
            raise error.with_traceback(_without_our_frames(error))  # noqa: B904  (the same error, not a new one)

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


def _run(function: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], size: int) -> Ran:
    """One attempt on this rank. Out of memory, the error (and through its frames the attempt's
    model, batch and perhaps process group) is forgotten here."""
    if size <= 0:
        raise RuntimeError("No executable batch size found, reached zero.")
    try:
        return "ok", function(size, *args, **kwargs), None
    except Exception as error:   # why: the user's function failed: out of memory backs off, any other is theirs
        if not should_reduce_batch_size(error):
            return "error", None, error
        forget(error)
    return "oom", None, None


def _alone(function: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], sizes: _Sizes,
           ran: Optional[Ran] = None, record: Optional[CallRecord] = None) -> Any:
    """One process: Accelerate's loop (from ``ran``, an attempt that already ran, if given). In a
    closed call (``record``) the ranks still end at one size: each attempt starts at most at the
    call's ``lowest``, each back-off lowers it, and a success above it runs again at it."""
    while True:
        lowest = _lowest(record)
        if ran is None and lowest is not None and lowest < sizes.size:
            sizes.size = lowest
        kind, result, error = ran if ran is not None else _run(function, args, kwargs, sizes.size)
        ran = None
        lowest = _lowest(record, sizes.size if kind == "ok" else None)
        if kind == "ok" and (lowest is None or lowest >= sizes.size):
            return result
        if error is not None:
            raise error
        result = None
        free_device_memory()
        if kind == "oom":
            _lowest(record, sizes.next())
        else:   # a peer of the call ended smaller after a success here: this rank goes there too
            log.info("find_executable_batch_size: another rank ended this call at batch size %s; this rank, done at "
                     "%d, runs again at that size", lowest, sizes.size)


def _lowest(record: Optional[CallRecord], size: Optional[int] = None) -> Optional[int]:
    """The closed call's lowest size, after lowering it to ``size`` if given; None outside a call or
    where the store is gone (rank 0, its host, ended: there is no one left to agree with)."""
    if record is None:
        return None
    try:
        if size is not None:
            record.lower(size)
        return record.lowest()
    except RuntimeError:   # DistStoreError / DistNetworkError
        log.debug("find_executable_batch_size: the call's lowest size cannot be read", exc_info=True)
        return None


def _in_the_group(function: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], sizes: _Sizes,
                  caller: Optional[types.FrameType]) -> Any:
    """Join this call's record (``batch_size_call``); run attempts until every rank of the group
    is in it (then they agree), or until it ran without some (then each goes on alone)."""
    import torch.distributed as dist
    store = dist.distributed_c10d._get_default_store()   # outlives every group re-created later
    record = CallRecord(store, call_key(function, caller), dist.get_rank(), dist.get_world_size())
    try:
        phase = record.join(sizes.size)
    except RuntimeError as error:   # the store's host (rank 0) is gone: there is no one to agree with
        log.info("find_executable_batch_size: the rendezvous store cannot be reached (%s); this rank goes on "
                 "alone", error)
        return _alone(function, args, kwargs, sizes)
    if phase == FAILED:
        raise follow_on(record.failure())
    if phase == CLOSED:
        return _alone(function, args, kwargs, sizes, record=record)
    while True:
        assert isinstance(phase, Phase)
        sizes.size = phase.size
        if record.everyone(phase):
            return _together(function, args, kwargs, sizes, record, phase.attempt)
        ran = _run(function, args, kwargs, sizes.size)
        settled = _settle(record, phase, ran, sizes)
        if settled == "together":
            return _together(function, args, kwargs, sizes, record, phase.attempt, ran)
        if settled == "alone":
            return _alone(function, args, kwargs, sizes, ran, record)
        phase = settled


def _settle(record: CallRecord, phase: Phase, ran: Ran, sizes: _Sizes) -> Union[str, Phase]:
    """After an attempt that began before every rank had joined: ``together`` when every rank
    has joined by now; the next attempt's phase when this rank is alone in the call and ran out
    of memory (a rank joining later starts there); else the call is closed (``alone``)."""
    kind, _, error = ran
    while True:
        seen = record.state()
        now = Phase.parse(seen)
        if seen == FAILED and error is None:   # a rank in the call failed: so does this one, with its note
            raise follow_on(record.failure())
        if now is None:
            return "alone"
        if record.everyone(now):
            return "together"
        if error is not None:
            record.fail(error)
            return "alone"
        if kind == "oom" and now.members == (record.rank,):
            retry = Phase(phase.attempt + 1, sizes.next(), (record.rank,))
            if record.change(seen, retry.text()):
                free_device_memory()
                return retry
            sizes.size = phase.size   # someone joined meanwhile: look again
        elif record.change(seen, CLOSED):
            return "alone"


def _together(function: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], sizes: _Sizes,
              record: CallRecord, attempt: int, ran: Optional[Ran] = None) -> Any:
    """Every rank of the group is in the call: the attempts of the whole group, from ``attempt``
    (whose run is ``ran`` when it already ran); the module docstring says how they stay in step."""
    import torch.distributed as dist
    from torch.distributed import PrefixStore
    different = record.different_starts()
    if different is not None:
        raise ValueError(different)
    rank, world_size, backend = record.rank, record.world_size, dist.get_backend()
    while True:
        ran = ran if ran is not None else _run(function, args, kwargs, sizes.size)
        keys = record.attempt_keys(attempt)
        result = _end_attempt(keys, record, ran, sizes)
        ran = None
        ends = _ends(keys, rank, world_size, sizes.size)
        failed = [(r, end) for r, end in enumerate(ends) if end.startswith("error ")]
        if failed:
            leave_group()
            raise follow_on(peer_failed(failed[0][0], failed[0][1][len("error "):]))
        proposals = [int(end.split()[1]) for end in ends if end.startswith("oom ")]
        if not proposals:
            return result
        result = None
        log.info("find_executable_batch_size: rank(s) %s ran out of memory at batch size %d; every rank goes "
                 "on with %d", [r for r, end in enumerate(ends) if end.startswith("oom ")], sizes.size,
                 min(proposals))
        sizes.size = min(proposals)
        leave_group()
        free_device_memory()
        attempt += 1
        dist.init_process_group(backend, store=PrefixStore(f"nl-bs-group/{attempt}", record.keys),
                                rank=rank, world_size=world_size, timeout=default_timeout(backend))


def _end_attempt(keys: Any, record: CallRecord, ran: Ran, sizes: _Sizes) -> Any:
    """Write how this rank's attempt ended (leaving the group first if the attempt failed, so that
    peers blocked in a collective with this rank fail at once); the result when it fit. A failure
    that is not out of memory and not caused by a peer's is raised (``_raise_own``)."""
    kind, result, error = ran
    rank = record.rank
    if kind == "oom":
        proposal = sizes.next()
        keys.set(f"oom/{rank}", str(proposal))   # before leaving: a peer that fails looks here
        end = f"oom {proposal}"
    elif error is not None and _caused_by_a_peer(keys, record.world_size):
        log.info("find_executable_batch_size: rank %d's attempt at batch size %d failed because another rank "
                 "ran out of memory or failed (%s)", rank, sizes.size, error)
        forget(error)
        end = "peer"
    elif error is not None:
        _raise_own(keys, record, error)
    else:
        keys.set(f"end/{rank}", "ok")
        return result
    del error, ran
    leave_group()
    keys.set(f"end/{rank}", end)
    return None


def _caused_by_a_peer(keys: Any, world_size: int) -> bool:
    """Whether a peer ran out of memory, or raised an error of its own, in this attempt."""
    for r in range(world_size):
        if keys.check([f"oom/{r}"]):
            return True
        if keys.check([f"end/{r}"]) and keys.get(f"end/{r}").decode().startswith("error "):
            return True
    return False


def _raise_own(keys: Any, record: CallRecord, error: BaseException) -> None:
    """Raise the user's error; the peers read it in the store first. A rank other than 0 raises
    at once: its error reaches the launch first, and its process ending releases a peer blocked
    in a collective with it. Rank 0 holds the store, and a peer must still read the error there
    (also when rank 0 catches its error and ends): it leaves its group, so that peers blocked with
    it fail, and waits until every peer has read the error."""
    keys.set(f"end/{record.rank}", f"error {type(error).__qualname__}: {error}")
    if record.rank == 0:
        leave_group()
        wait_for_reads(keys, record.world_size)
    raise error


def _ends(keys: Any, rank: int, world_size: int, size: int) -> list[str]:
    """Every rank's end of the attempt (``wait_for_ends``); a store that went away is said plainly."""
    try:
        return wait_for_ends(keys, rank, world_size)
    except RuntimeError as error:   # DistStoreError / DistNetworkError: rank 0, the store's host, ended
        raise RuntimeError(f"find_executable_batch_size: the rendezvous store went away while this rank waited "
                           f"for the other ranks to finish the attempt at batch size {size}: rank 0, which holds "
                           f"it, ended or failed (its own error says why): {error}") from None


def _without_our_frames(error: BaseException) -> Optional[types.TracebackType]:
    """``error``'s traceback without the frames of the batch-size finder (also in the errors it
    chains to): what the user sees starts and ends in their own code."""
    from . import batch_size_call, batch_size_group
    ours = {__file__, batch_size_call.__file__, batch_size_group.__file__}
    seen: set[int] = set()
    chained: Optional[BaseException] = error
    while chained is not None and id(chained) not in seen:
        seen.add(id(chained))
        kept = []
        traceback = chained.__traceback__
        while traceback is not None:
            if traceback.tb_frame.f_code.co_filename not in ours:
                kept.append(traceback)
            traceback = traceback.tb_next
        for entry, following in zip(kept, kept[1:] + [None]):
            entry.tb_next = following
        chained.__traceback__ = kept[0] if kept else None
        chained = chained.__cause__ or chained.__context__
    return error.__traceback__
