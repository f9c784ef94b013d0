"""Each rank's resources over one supervised run: which ranks can be read on this machine, a round
of samples on the supervision loop's turns (``oom.MemoryWatch``, with its ``resources.ResourceSampler``),
the warning before memory runs out, what remote ranks report of themselves, and an out-of-memory
death or allocation failure said as what it was.

Why a collaborator of its own: the loop only says when (each turn, each event, each death); which
ranks are read here, where the warning goes (the cell and every rank's log) and what the memory
watch keeps between rounds is this class's, so the loop reads as the loop.
"""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from ..errors.best_effort import best_effort
from ..wire.protocol import Failure
from ..record.state import RunState
from ..process.leftovers import birth_of
from . import oom

if TYPE_CHECKING:
    from ..record.logs import LogWriter
    from .outcome import RankEnd
    from .watch import RankWatch


class ResourceWatch:
    """The resources of the ranks of ``watches``, into ``state`` (rows, header) and ``logs``."""

    def __init__(self, watches: Sequence[RankWatch], state: RunState, logs: LogWriter,
                 memory: oom.MemoryWatch | None = None) -> None:
        """``memory``: a watch kept across the calls of persistent ranks (their pool's, which
        closes it): a call then starts from its last round, shown in the call's rows at once,
        and rounds stay SAMPLE_EVERY apart across calls instead of one more per call (a call of a
        millisecond spent half of it reading /proc, issue 45). None: this run's own."""
        self.watches = watches
        self.state = state
        self.logs = logs
        self.owned = memory is None
        # the OOM counters at the start, each rank's memory as last sampled (an OOM death named)
        self.memory = oom.MemoryWatch(((rs.local_rank, rs.rank) for rs in state.ranks),
                                      born_after=birth_of(state.run_id)) if memory is None else memory
        if memory is not None:
            memory.begin_call()
            memory.resources.show(state)
        with best_effort("could not read when the ranks started"):
            self.memory.resources.note_births(self.sampled_pids())

    def sampled_pids(self) -> dict[int, int]:
        """Local rank -> pid of each live rank whose memory can be read here (its own process, on
        this machine); ranks sharing one process (XLA) are sampled once, as its first rank."""
        pids: dict[int, int] = {}
        for w in self.watches:
            if w.exit is None and w.process.on_this_machine and w.process.pid not in pids.values():
                pids[w.local_rank] = w.process.pid
        return pids

    def sample(self) -> None:
        """Each local rank's CPU, memory and GPU into its row and now and then its log, and the
        machine's memory into the header (``supervise.resources``, a round when one is due); the
        same round's memory is what an OOM death's message quotes (``oom.MemoryWatch``)."""
        devices = {rs.local_rank: rs.device for rs in self.state.ranks}
        self.warn_of_memory(self.memory.sample(self.sampled_pids(), devices=devices))
        # an extra: the run goes on without it
        with best_effort("could not show the ranks' resources"):
            self.memory.resources.publish(self.state, self.logs)

    def warn_of_memory(self, warning: str | None) -> None:
        """Say, before anything dies, that memory is running out (``oom.MemoryWatch.notebook_at_risk``):
        in the cell (stderr) and in every rank's log."""
        if warning is None:
            return
        print(warning, file=sys.stderr, flush=True)
        for local_rank in range(len(self.state.ranks)):
            self.logs.write_block(local_rank, warning)

    def reported(self, local_rank: int, record: Mapping[str, Any]) -> None:
        """A rank on another machine sampled itself (``rank.reports.resources``): its RESOURCES event."""
        self.memory.resources.reported(local_rank, record)

    def name_failure(self, failure: Failure, watch: RankWatch, payload: Mapping[str, Any]) -> Failure:
        """``failure`` (the rank's ERROR, ``payload``) with what ran out said: an allocation that
        failed, or a child the error names that the OOM killer killed (only a rank of this machine
        can be asked about: a remote rank's pids mean nothing here)."""
        pid = watch.process.pid if watch.process.on_this_machine else None
        return self.memory.name_failure(failure, watch.local_rank, pid, payload)

    def ended(self, watch: RankWatch, shared: bool) -> None:
        """A rank of this machine reaped: what the kernel counted of its life (its peak resident
        memory, ``channels.EndUsage``) into its row, even where no sample came before it ended, and its
        log's line over its life. A process that carries several ranks (XLA) is left as sampled: its
        count is theirs together. A rank on another machine (no count of the kernel's here) has its
        last own sample in that line."""
        usage = watch.process.end_usage
        if shared:
            return
        if usage is None:   # a rank on another machine: its log's line over its life says its last sample
            self.memory.resources.ended_as_sampled(watch.local_rank)
            with best_effort("could not show a rank's resources"):
                self.memory.resources.publish(self.state, self.logs)
            return
        # The kernel's count is the largest of the rank's and of every child it reaped (a DataLoader
        # worker the OOM killer took): a rank that reported its own peak with its error is shown that
        own = watch.error.get("peak") if watch.error is not None else None
        self.memory.resources.ended(watch.local_rank, own if isinstance(own, int) and own > 0 else usage.peak_rss,
                                    usage.cpu_seconds)
        with best_effort("could not show a rank's resources"):
            self.memory.resources.publish(self.state, self.logs)

    def name_kill(self, end: RankEnd, watch: RankWatch) -> RankEnd:
        """A rank's end, a SIGKILL said as the OOM killer's or not (``oom``); only a rank of this
        machine can be told (a remote rank's pid means nothing here)."""
        process = watch.process
        if not process.on_this_machine:
            return end
        live = {local: pid for local, pid in self.sampled_pids().items() if pid != process.pid}
        return self.memory.name_kill(end, watch.local_rank, process.pid, live)

    def close(self) -> None:
        """Release what the sampler holds (NVML), if this run's own."""
        if self.owned:
            self.memory.resources.close()
