"""Start ranks on TPUs (or PJRT_DEVICE=CPU) with torch_xla's xmp.spawn.

xmp.spawn lays replicas out itself: one process per TPU chip, one thread per
XLA device of that chip (a v2-8/v3-8 is 4 processes x 2 threads; PJRT on CPU
is 1 process x CPU_NUM_DEVICES threads). It drops return values, does not stop
the other replicas when one fails, and refuses to start once the runtime is
initialized. So the parent forks one *launcher* child that calls
``xmp.spawn(nprocs=None or 1, start_method="fork")``; every replica, thread or
process, finds its own rank's pipes (opened by the parent before the fork) by
its global ordinal and runs ``rank.runner.run_rank`` with them (``rank.xla_replicas``). Each ordinal is
one rank: one panel row, one RESULT or ERROR. The launcher leads a process
group that holds every replica, so the supervisor stops all of them at once.

Where the replicas are (issue 20): the supervisor asks the launcher (``ask_where``), which reads
each replica's own record (``rank.xla_replicas``) from the process that carries it, has each such
process dump its Python threads once, and gives each replica its own thread's stack.

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

from .. import leftovers
from ..supervise.hang_verdict import RankWhereabouts
from ..channels import RankPipes, RankProcess
from ..notebook_streams import ERR, OUT
from .base import Launcher
from .fork import ForkedRank
from .fork_thread import fork_from_clean_thread

if TYPE_CHECKING:
    from ..plan import LaunchPlan
    from ..rank.runner import Job

log = logging.getLogger("notebook_launch")
# What importing torch_xla wrote into os.environ when prepare_parent imported it
# (kept for every later launch of this notebook: torch_xla is imported only once).
_import_environ: dict[str, str] = {}


class XlaLauncherProcess(ForkedRank):
    """The launcher child: one process that carries every ordinal of the run."""

    def __init__(self, local_ranks: Sequence[int], pid: int) -> None:
        super().__init__(local_ranks[0], pid)
        self.local_ranks = tuple(local_ranks)

    def ask_where(self, global_rank: Callable[[int], int]) -> dict[int, RankWhereabouts]:
        """Local rank -> where that replica is, for the replicas that could say (see the module
        docstring); the supervisor asks every other rank itself."""
        return replica_whereabouts(self.pid, self.local_ranks, global_rank)


def replica_records(launcher: int) -> dict[int, tuple[int, str]]:
    """Ordinal -> (pid of the process running that replica, /proc path of its record), from the
    launcher and its descendants. A replica's forked child (a DataLoader worker) inherits the memfd:
    only the process the record names as its own counts."""
    from ..rank.xla_replicas import REPLICA_RECORD_NAME
    from ..supervise.native_stacks import children
    from ..supervise.memfds import memfds
    from ..supervise.stacks import read_record

    found: dict[int, tuple[int, str]] = {}
    queue = [launcher]
    while queue:
        pid = queue.pop(0)
        queue.extend(children(pid))
        for name, paths in memfds(pid).items():
            ordinal = name.removeprefix(REPLICA_RECORD_NAME)
            if ordinal != name and ordinal.isdigit():
                for path in paths:   # its own, not one inherited from whatever forked it
                    record = read_record(path)
                    if record is not None and record[0] == pid:
                        found[int(ordinal)] = (pid, path)
                        break
    return found


def replica_whereabouts(launcher: int, local_ranks: Sequence[int],
                        global_rank: Callable[[int], int]) -> dict[int, RankWhereabouts]:
    """Where each replica is: its xm collective (its own record), its own thread's stack (one dump
    per process, split by thread), and, for a process that runs one replica only, the process's
    torch.distributed record too. Then who waits: see ``who_waits``."""
    from ..supervise import stacks

    records = replica_records(launcher)
    by_process: dict[int, list[int]] = {}
    for local in local_ranks:
        if local in records:
            by_process.setdefault(records[local][0], []).append(local)
    answers: dict[int, RankWhereabouts] = {}
    for pid, locals_here in by_process.items():
        process = stacks.collect([(global_rank(locals_here[0]), pid)])[0]
        for local in locals_here:
            record = stacks.read_record(records[local][1])
            where = RankWhereabouts(global_rank(local), note=process.note if not process.threads else "")
            if record is not None:
                _pid, where.main_thread, _signum, collective, inside = record
                if inside:
                    where.inside = collective
                else:
                    where.last = collective
            where.threads = [thread for thread in process.threads if thread.ident == where.main_thread]
            where.raw_stacks = process.raw_stacks
            if len(locals_here) == 1 and where.inside is None and where.last is None:
                where.inside, where.last = process.inside, process.last   # torch.distributed on XLA
            answers[local] = where
    who_waits(list(answers.values()))
    return answers


def who_waits(replicas: Sequence[RankWhereabouts]) -> None:
    """xm's collectives are lazy (``rank.xla_replicas``): a replica that issued collective #n waits
    in it when another replica has not issued #n (it cannot complete without it), or when another
    issued a different collective as its #n (the graphs do not match: a different order). Such
    replicas are marked ``inside`` it; the others keep it as the last one they called."""
    issued = [r for r in replicas if r.last is not None and r.last.op not in ("rendezvous", "xla_rendezvous")]
    if not issued:
        return
    for group in {r.last.group for r in issued if r.last is not None}:
        members = [r for r in replicas if r.last is None or r.last.group == group]
        numbers = {r.last.seq if r.last is not None else 0 for r in members}
        top = max(numbers)
        ops = {r.last.op for r in members if r.last is not None and r.last.seq == top}
        if len(numbers) > 1 or len(ops) > 1:
            for r in members:
                if r.last is not None and r.last.seq == top and r.last.group == group:
                    r.inside, r.last = r.last, None


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
        except Exception:  # the launcher imports it again and reports the error as rank 0's
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
        from ..rank.xla_replicas import run_launcher

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
        # its keeper ends that group and whatever carries the run's mark (as start_each does per rank).
        leftovers.guard(plan.ranks[0].env.get(leftovers.RUN_MARK, ""), pid)
        for pipes in channels:
            pipes.close_child_ends()
        return [XlaLauncherProcess([spec.local_rank for spec in plan.ranks], pid)]


