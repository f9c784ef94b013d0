"""Start ranks on TPUs (or PJRT_DEVICE=CPU) with torch_xla's xmp.spawn.

xmp.spawn lays replicas out itself: one process per TPU chip, one thread per
XLA device of that chip (a v2-8/v3-8 is 4 processes x 2 threads; PJRT on CPU
is 1 process x CPU_NUM_DEVICES threads). It drops return values, does not stop
the other replicas when one fails, and refuses to start once the runtime is
initialized. So the parent forks one *launcher* child that calls
``xmp.spawn(nprocs=None or 1, start_method="fork")``; every replica, thread or
process, finds its own rank's pipes (opened by the parent before the fork) by
its global ordinal and runs ``rank.runner.run_rank`` with them (``engines.xla.replicas``). Each ordinal is
one rank: one panel row, one RESULT or ERROR. The launcher leads a process
group that holds every replica, so the supervisor stops all of them at once.

Where the replicas are (issue 20): the supervisor asks the launcher (``where``), which reads
each replica's own record (``engines.xla.replicas``) from the process that carries it, has each such
process dump its Python threads once, and gives each replica its own thread's stack
(``engines.xla.replica_whereabouts``).

Output: a replica that is the only thread of its process owns fds 1/2. Threads
of one process share fds 1/2, so Python-level writes (print, logging to
sys.stdout/err) are routed per thread by ``ThreadRoutedStream``; C-level
output of such a process lands on its first device's rank.
"""
from __future__ import annotations

import logging
import os
import sys
from typing import TYPE_CHECKING, Callable, NoReturn, Sequence

from ...process import leftovers
from ...diagnose.hang_verdict import RankWhereabouts
from .replica_whereabouts import replica_whereabouts
from ...channels import RankPipes, RankProcess
from ...notebook.notebook_streams import ERR, OUT
from ..base import Launcher
from ..local.fork import ForkedRank
from ..local.fork_thread import fork_from_clean_thread

if TYPE_CHECKING:
    from ...wire.plan import LaunchPlan
    from ...rank.runner import Job

log = logging.getLogger("notebook_launch")
# What importing torch_xla wrote into os.environ when prepare_parent imported it
# (kept for every later launch of this notebook: torch_xla is imported only once).
_import_environ: dict[str, str] = {}


class XlaLauncherProcess(ForkedRank):
    """The launcher child: one process that carries every ordinal of the run."""

    def __init__(self, local_ranks: Sequence[int], pid: int) -> None:
        super().__init__(local_ranks[0], pid)
        self.local_ranks = tuple(local_ranks)

    def where(self, global_rank: Callable[[int], int]) -> dict[int, RankWhereabouts]:
        """Local rank -> where that replica is, for the replicas that could say
        (``engines.xla.replica_whereabouts``): this one process carries them all."""
        return replica_whereabouts(self.pid, self.local_ranks, global_rank)


class XlaBackend(Launcher):
    name = "xla"

    def prepare_parent(self) -> None:
        """Import torch_xla once in the notebook, so each launch's forked launcher
        shares it instead of importing it again (5-20 s). Importing does not start
        the runtime; what it writes into os.environ (XLA_FLAGS, PJRT_DYNAMIC_PLUGINS,
        ...) is undone here and set in every launcher instead, so the notebook's
        environment stays as it was."""
        global _import_environ
        if "torch_xla.distributed.xla_multiprocessing" in sys.modules:
            return
        before = dict(os.environ)
        try:
            import torch_xla.distributed.xla_multiprocessing  # noqa: F401
        except Exception:   # why: the launcher imports it again and reports the error as rank 0's
            log.debug("importing torch_xla in the notebook failed", exc_info=True)
        finally:
            changed = {k: v for k, v in os.environ.items() if before.get(k) != v}
            for key in changed:
                if key in before:
                    os.environ[key] = before[key]
                else:
                    del os.environ[key]
            _import_environ = changed

    def start(self, plan: "LaunchPlan", job: "Job", channels: Sequence[RankPipes]) -> list[RankProcess]:
        from .replicas import run_launcher

        OUT.flush()
        ERR.flush()
        parent_pid = os.getpid()
        nprocs = 1 if len(plan.ranks) == 1 else None  # the only values PJRT accepts

        def launcher() -> NoReturn:
            os.environ.update(_import_environ)
            run_launcher(plan, job, channels, parent_pid, nprocs)   # never returns
            os._exit(1)

        # Not os.fork() from this thread: it may have run an OpenMP region (a torch op in a
        # cell), and with one device torch_xla runs the function on the launcher's main
        # thread, whose first parallel region would then deadlock (see fork_thread).
        pid = fork_from_clean_thread(launcher)
        # The launcher leads the replicas' process group: if the notebook dies before the run is swept,
        # its keeper ends that group and whatever carries the run's mark (as start_each does for its ranks).
        leftovers.guard(plan.ranks[0].env.get(leftovers.RUN_MARK, ""), pid)
        for pipes in channels:
            pipes.close_child_ends()
        return [XlaLauncherProcess([spec.local_rank for spec in plan.ranks], pid)]


