"""Which ranks are in one call of ``find_executable_batch_size``, kept in the rendezvous store.

A call may be made on every rank or on some only (an evaluation under ``if rank == 0:``), and a
rank cannot know whether a peer that has not called yet is late or will never call. So no rank
ever waits for a rank that has not joined the call; who is in it is written in one store key,
changed only by ``compare_set`` (so a join and a close never cross):

- ``open A S M``: attempt A runs at batch size S; the ranks M joined it. A rank that calls joins
  the attempt under way (a rank that alone ran out of memory moved the call on to the next
  attempt and size: a late rank starts there, never at the size that failed).
- Once M is every rank of the group, the call is the whole group's: every attempt's result is
  returned only when every rank finished it (``batch_size``), and the starting sizes must match.
- ``closed``: a rank finished an attempt while some rank of the group had not joined: the call
  ran without them, and each rank in it (or calling later) goes on alone, as Accelerate's does,
  but never above ``lowest``: the smallest size a rank of the call ended at or backed off to.
- ``failed``: a rank in it raised an error that is not out of memory (``failure`` says which);
  a rank that calls later raises that error's note at once.

A call is known by the decorated function's code, the line that called it, and how many times
this rank made such a call before: the same on every rank that runs the same code, and apart
for the evaluation on one rank and the training on all (different lines).
"""
from __future__ import annotations

import collections
import time
import types
from dataclasses import dataclass
from typing import Any, Optional

CLOSED, FAILED = "closed", "failed"
_counts: collections.Counter[str] = collections.Counter()   # calls this rank made, per code and line


def call_key(function: Any, caller: Optional[types.FrameType]) -> str:
    """This call's name in the store: the function's code, the calling line, and how many such
    calls this rank made before (a second call is a new agreement, never mixed with the first)."""
    code = getattr(function, "__code__", None)
    where = f"{code.co_filename}:{code.co_firstlineno}:{code.co_name}" if code is not None else repr(function)
    if caller is not None:
        where += f"@{caller.f_code.co_filename}:{caller.f_lineno}"
    count = _counts[where]
    _counts[where] += 1
    return f"{where}#{count}"


@dataclass(frozen=True)
class Phase:
    """An open call: attempt ``attempt`` runs at ``size``; ``members`` joined it."""
    attempt: int
    size: int
    members: tuple[int, ...]

    def text(self) -> str:
        return f"open {self.attempt} {self.size} {','.join(map(str, self.members))}"

    @staticmethod
    def parse(text: str) -> Optional["Phase"]:
        """The open phase ``text`` says, or None for ``closed`` and ``failed``."""
        if not text.startswith("open "):
            return None
        _, attempt, size, members = text.split(" ")
        return Phase(int(attempt), int(size), tuple(int(m) for m in members.split(",")))


class CallRecord:
    """One call's keys in the store (prefixed by its ``call_key``) for this rank."""

    def __init__(self, store: Any, key: str, rank: int, world_size: int) -> None:
        from torch.distributed import PrefixStore
        self.store = store
        self.keys = PrefixStore(f"nl-bs/{key}/", store)
        self.rank, self.world_size = rank, world_size

    def join(self, start: int) -> str | Phase:
        """Join the attempt under way (or open the call at ``start``): the phase joined, or
        ``closed`` / ``failed`` when the call is past joining."""
        self.keys.set(f"start/{self.rank}", str(start))   # before joining: whoever sees us joined reads it
        seen = ""
        while True:
            phase = Phase.parse(seen) if seen else Phase(0, start, ())
            if phase is None:
                return seen
            joined = Phase(phase.attempt, phase.size, tuple(sorted(phase.members + (self.rank,))))
            now = self.keys.compare_set("state", seen, joined.text()).decode()
            if now == joined.text():
                return joined
            seen = now

    def state(self) -> str:
        return self.keys.get("state").decode()

    def change(self, seen: str, new: str) -> bool:
        """Set the state to ``new`` if it is still ``seen``."""
        return bool(self.keys.compare_set("state", seen, new).decode() == new)

    def everyone(self, phase: Phase) -> bool:
        return len(phase.members) == self.world_size

    def different_starts(self) -> Optional[str]:
        """The error's text when the ranks called with different starting sizes, else None."""
        starts = [int(self.keys.get(f"start/{r}")) for r in range(self.world_size)]
        if len(set(starts)) == 1:
            return None
        listed = ", ".join(f"rank {r}: {s}" for r, s in enumerate(starts))
        return (f"find_executable_batch_size was called with a different starting_batch_size on each rank "
                f"({listed}); the ranks must run with one batch size, so pass the same starting_batch_size "
                f"on every rank (for example the smallest, agreed on before the call)")

    def lowest(self) -> Optional[int]:
        """The smallest batch size a rank of this call ended at or backed off to, once the call
        closed (``lower``); None before any did."""
        if not self.keys.check(["lowest"]):
            return None
        return int(self.keys.get("lowest"))

    def lower(self, size: int) -> None:
        """Record ``size`` as the call's lowest if it is below the one recorded (``compare_set``:
        two ranks lowering it at once keep the smaller)."""
        seen = self.keys.get("lowest").decode() if self.keys.check(["lowest"]) else ""
        while not seen or int(seen) > size:
            now = self.keys.compare_set("lowest", seen, str(size)).decode()
            if now == str(size):
                return
            seen = now

    def fail(self, error: BaseException) -> None:
        """Say that this rank raised ``error`` (not out of memory) in the call; later callers read it."""
        self.keys.set("failure", f"{self.rank} {type(error).__qualname__}: {error}")
        seen = self.state()
        while Phase.parse(seen) is not None and not self.change(seen, FAILED):
            seen = self.state()

    def failure(self) -> str:
        rank, what = self.keys.get("failure").decode().split(" ", 1)
        return peer_failed(int(rank), what)

    def attempt_keys(self, attempt: int) -> Any:
        from torch.distributed import PrefixStore
        return PrefixStore(f"{attempt}/", self.keys)


def peer_failed(rank: int, what: str) -> str:
    return (f"rank {rank} failed inside find_executable_batch_size with {what}; the other ranks stop the "
            f"call with this error (rank {rank}'s own traceback says why)")


def wait_for_ends(keys: Any, rank: int, world_size: int) -> list[str]:
    """Every rank's end of this attempt, in rank order, once all wrote theirs; or as soon as one
    rank's end is an error (that rank went on, raising: no more ends may come).

    Polled with ``check`` rather than one long ``wait``: the rank stays interruptible (a
    KeyboardInterrupt or a stop reaches its Python code), and a timed-out ``wait`` logs a C++
    warning each time."""
    ends: dict[int, str] = {}
    pause = _Pause()
    while len(ends) < world_size:
        for r in range(world_size):
            if r not in ends and keys.check([f"end/{r}"]):
                ends[r] = keys.get(f"end/{r}").decode()
                if ends[r].startswith("error "):
                    break
        if any(end.startswith("error ") for end in ends.values()):
            break
        if len(ends) < world_size:
            pause.sleep()
    # Rank 0 hosts the store (torch's rule for MASTER_ADDR/MASTER_PORT): it must not go on (and
    # perhaps end its process) while another rank is still reading, so the others say they read.
    if rank == 0:
        wait_for_reads(keys, world_size)
    else:
        keys.set(f"read/{rank}", "1")
    return [ends.get(r, "") for r in range(world_size)]


def wait_for_reads(keys: Any, world_size: int) -> None:
    """Rank 0: until every other rank said it read the attempt's ends, or ended it with an error
    (such a rank raised at once, and reads nothing more)."""
    waiting = set(range(1, world_size))
    pause = _Pause()
    while waiting:
        for r in sorted(waiting):
            if keys.check([f"read/{r}"]) or (keys.check([f"end/{r}"]) and
                                             keys.get(f"end/{r}").decode().startswith("error ")):
                waiting.discard(r)
        if waiting:
            pause.sleep()


class _Pause:
    """Sleeps between two looks in the store: a millisecond at first, doubling up to 0.1 s."""

    def __init__(self) -> None:
        self.seconds = 0.001

    def sleep(self) -> None:
        time.sleep(self.seconds)
        self.seconds = min(self.seconds * 2, 0.1)
