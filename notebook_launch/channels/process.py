"""The handle on a started rank process, as the supervisor watches and ends it."""
from __future__ import annotations

import abc
import logging
import os
import signal
import time

log = logging.getLogger("notebook_launch")
# How a process ended: ("exit", code) or ("signal", signum); STUCK when it would not end.
WaitStatus = tuple[str, int]
# A process that outlived SIGKILL by WAIT_LIMIT seconds is stuck in uninterruptible sleep (state D:
# in the kernel, usually a device driver releasing a GPU or TPU). It cannot be reaped until it
# leaves it, so waiting on would hang the cell: wait() gives up and says so instead.
WAIT_LIMIT = 30.0
STUCK: WaitStatus = ("stuck", -1)   # -1: torch's exit code for "unknown"


class RankProcess(abc.ABC):
    """Handle on a started rank. ``sentinel`` is a file descriptor that becomes
    readable when the process exits, so the supervisor can select on it.

    A process that carries several ranks (XLA: xmp.spawn runs one thread per
    device) sets ``local_ranks`` to all of them; the supervisor then watches
    each rank's pipes and ends them all when the process ends."""

    local_rank: int
    local_ranks: tuple[int, ...] = ()     # empty: just (local_rank,)
    pid: int
    sentinel: int | None
    end_note: str | None = None           # how it ended when no exit status says it (a Ray actor's death)
    wait_limit: float = WAIT_LIMIT        # seconds wait() waits for a process that should be ending
    on_this_machine: bool = True          # False: ``pid`` is a process of another machine (a Ray actor)

    @abc.abstractmethod
    def poll(self) -> WaitStatus | None:
        """None while running; else a wait status description: ("exit", code) or ("signal", signum)."""

    def wait(self) -> WaitStatus:
        """Block until the process ended (its sentinel may fire before waitpid sees it), at
        most ``wait_limit`` seconds: a process still there then is stuck (see WAIT_LIMIT) and
        ``STUCK`` is returned, its ``end_note`` saying so; it is left behind, unreaped."""
        limit = self.wait_limit
        deadline = time.monotonic() + limit
        pause = 0.005
        while True:
            status = self.poll()
            if status is not None:
                return status
            if time.monotonic() >= deadline:
                self.end_note = stuck_note(self.pid, limit)
                log.debug("rank process %d: %s", self.pid, self.end_note)
                return STUCK
            time.sleep(pause)
            pause = min(pause * 2, 0.1)

    def ranks(self) -> tuple[int, ...]:
        """The local ranks this process carries: one for fork/spawn, every ordinal of it for XLA."""
        return self.local_ranks or (self.local_rank,)

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the rank and everything it started (its process group)."""
        try:
            os.killpg(self.pid, signum)
        except (ProcessLookupError, PermissionError):
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                log.debug("rank process %d is gone already", self.pid)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)

    def release(self) -> None:  # noqa: B027  (a hook: a process with nothing to free has nothing here)
        """Free the sentinel and any other resource once the process is reaped."""


def stuck_note(pid: int, limit: float) -> str:
    return (f"did not end within {limit:g} s of being killed: process {pid} is stuck in the kernel "
            f"(uninterruptible sleep, usually a GPU/TPU driver) and was left behind; if the device stays "
            f"busy, restart the runtime")
