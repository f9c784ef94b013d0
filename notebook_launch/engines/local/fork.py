"""Start ranks with os.fork: the fastest start, and the only one that can run a
function defined in a notebook cell without pickling it. Safe while the
parent holds no CUDA context (guards check that first)."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Callable, NoReturn, Sequence

from ...channels import PidfdRank, RankPipes, RankProcess, WaitStatus, reap
from ..base import Launcher, start_all
from .fork_thread import fork_all_from_clean_thread
from .warm_imports import warm_for

if TYPE_CHECKING:
    from ...wire.plan import LaunchPlan, RankSpec
    from ...rank.runner import Job


class ForkedRank(PidfdRank):
    def __init__(self, local_rank: int, pid: int, sentinel: int | None = None) -> None:
        """``sentinel``: the pid's pidfd, opened by the forking thread (else opened here)."""
        self.local_rank = local_rank
        self.pid = pid
        self.sentinel = os.pidfd_open(pid) if sentinel is None else sentinel
        self._status: WaitStatus | None = None

    def poll(self) -> WaitStatus | None:
        if self._status is None:
            ended = reap(self.pid, self.sentinel)
            if ended is not None:
                self._status, self.end_usage = ended
        return self._status


class ForkBackend(Launcher):
    name = "fork"

    def start(self, plan: "LaunchPlan", job: "Job", channels: Sequence[RankPipes]) -> list[RankProcess]:
        from ...rank import environment
        from ...rank.bootstrap import signals_to_reset
        from ...rank.fork_entry import fds_to_close, run_forked_rank
        from ...rank.group.process_groups import patch_before_forks
        from ...rank.integrations.tqdm_bridge import hook_before_forks

        # what the ranks would import after the fork (torch._dynamo for training), said in their rows
        warm_for(job.function, say=self.start_watch.phase)
        self.start_watch.phase("")

        parent_pid = os.getpid()
        signals = signals_to_reset()   # read here, once: each rank then sets only those that differ
        patch_before_forks()   # once each, inert in the notebook: a rank turns them on (issue 45)
        hook_before_forks()

        def child_of(spec: "RankSpec", inherited: list[tuple[bytes, bytes]] | None) -> Callable[[], NoReturn]:
            pipes = channels[spec.local_rank]
            # here, whole: the rank only points its environment at it (not on pages it would copy)
            env = environment.prepare(spec.env, inherited)
            close = fds_to_close(pipes, channels)

            def child() -> NoReturn:
                run_forked_rank(spec, job, pipes, channels, parent_pid, env, signals, close)   # never returns
                os._exit(1)
            return child

        def start(specs: Sequence["RankSpec"]) -> list[RankProcess]:
            # Not os.fork() here: this thread may have run an OpenMP region (see fork_thread). All
            # ranks in one turn of the fork helper, which opens each one's pidfd as it forks it.
            inherited = environment.inherited_c_environment()   # the notebook's, just before the forks
            forked = fork_all_from_clean_thread([child_of(spec, inherited) for spec in specs])
            return [ForkedRank(spec.local_rank, pid, pidfd) for spec, (pid, pidfd) in zip(specs, forked)]

        return start_all(plan, channels, start)
