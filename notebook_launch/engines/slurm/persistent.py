"""Persistent ranks on a SLURM allocation: ``start_ranks(n, cluster=SlurmCluster(...))``.

The same ``Ranks`` as local and Ray persistent ranks (``pool``), over its own transport
(``SlurmTransport``, an ``engines.remote.persistent.RemoteTransport``): one call at a time, each
supervised by ``call.CallSupervisor`` with the same panel, logs, LaunchError texts, interrupt and timeout
rules, and the between-calls reader. What differs is where the ranks live:

- starting: through the launcher interface, as a SLURM launch does (``slurm.launcher``):
  ``SlurmLauncher(persistent=True).start`` asks for the allocation (``salloc --no-shell``; while
  it waits in the queue the cell says so, and Ctrl-C cancels it), starts one ``srun`` step per
  node whose agent (``engines.slurm.node_agent``) forks that node's ranks, each running
  ``engines.slurm.task`` and connecting its streams back to the notebook
  (``channels.sockets``), and the watchdog that cancels the job if the notebook dies. The
  rank's job is ``engines.remote.serve.serve_ray_calls``, the serving loop every persistent rank on
  another machine runs (a Ray actor's too):
  the allocation and the ranks are held across cells;
- talking to a rank: as to a Ray rank (``remote``): a call's frame, an interrupt and STOP are
  messages on the rank's events connection; where each rank is, is asked on the same
  connection (``diagnose.remote_where``, as for a SLURM launch);
- ending: ``close()`` sends STOP, then ends the launcher: the steps and the job are cancelled
  and waited for until SLURM holds nothing of them (squeue is empty for it), and the watchdog is
  let go. A notebook kernel that dies runs none of this: its watchdog sees the end of its pipe
  and scancels the job, and each rank exits when its connection to the notebook ends;
- a lost rank: a rank lost during a call fails the call as on a SLURM launch (the scheduler's
  cause named: a time limit, a node failure, a preemption); ranks lost between calls (the job
  reached its time limit, a node died) make the next call a LaunchError naming them, their node
  and the scheduler's cause, after every rank was stopped and the job ended; the call after that
  asks for a new allocation and starts fresh ranks, saying so.
"""
from __future__ import annotations

import logging
import subprocess
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..base import StartWatch
from ...errors import GuardError
from ...record.logs import make_run_id
from ...notebook.notebook_streams import OUT
from ...planning.options import LaunchOptions, check_display_ranks_exist, validate_cluster_launch, validate_cluster_type
from ...planning.prepare import entry_options
from ..remote.serve import serve_ray_calls
from ...rank.runner import Job
from ...scaffold.session import plan_state
from . import scheduler
from .launcher import SlurmLauncher
from ...wire.plan import cluster_plan
from .run import check_layout, request_summary
from ...persistent.pool import Ranks
from ..remote.persistent import RemoteTransport, lost_between_calls_error
from ...persistent.transport import LogsFor, LostBetweenCalls

if TYPE_CHECKING:
    from ...channels import RankProcess
    from ...record.logs import RunLogs
    from ...wire.plan import LaunchPlan
    from .cluster import SlurmCluster

log = logging.getLogger("notebook_launch")


def start_slurm_ranks(cluster: "SlurmCluster", parameters: Mapping[str, Any], grace: float) -> "SlurmRanks":
    """``start_ranks(num_processes, cluster=SlurmCluster(...))``: hold the allocation and start the
    ranks now (see the module). ``parameters``: ``start_ranks``' own, checked as theirs are
    (``grace``: its ``interrupt_grace``, checked there); ``use_port`` and ``master_addr`` are not
    used (rank 0's node and the job's port are), and a ``start_method`` is refused (srun starts
    the ranks)."""
    from .cluster import SlurmCluster
    validate_cluster_type(cluster, SlurmCluster)
    options = entry_options(parameters, function=serve_ray_calls, called_as_given=False)
    world_size = validate_cluster_launch(options)
    check_layout(world_size, cluster)
    scheduler.check_commands()
    scheduler.check_can_start(cluster, world_size)   # a job SLURM would queue and never start is not submitted
    ranks = SlurmRanks(options, grace, SlurmTransport(options, cluster))
    ranks._start()
    return ranks


class SlurmRanks(Ranks):
    """Persistent ranks on a SLURM allocation; made by ``start_ranks(..., cluster=SlurmCluster(...))``,
    used as ``Ranks``, with the job that holds them (``job_id``) and where each rank runs (``nodes``)."""

    def __init__(self, options: LaunchOptions, grace: float, transport: SlurmTransport) -> None:
        super().__init__(options, grace, transport)
        self.slurm = transport

    @property
    def cluster(self) -> "SlurmCluster":
        return self.slurm.cluster

    @property
    def job_id(self) -> str | None:
        """The SLURM job that holds the ranks' allocation (None once closed)."""
        return self.slurm.job_id

    @property
    def nodes(self) -> list[str]:
        """Where each rank runs, by global rank: "node N (name)"."""
        return self.slurm.nodes

    def __repr__(self) -> str:
        text = super().__repr__()
        return text.replace("<Ranks:", f"<Ranks on SLURM job {self.job_id}:" if self.job_id else "<Ranks on SLURM:", 1)


class Announcer(StartWatch):
    """Who sees persistent ranks' allocation wait, before any call's panel: the news a launch's
    panel says once in the cell (the job's id, "pending (Resources)", where it runs) is printed
    in the cell that starts the ranks. Ctrl-C ends the wait (the launcher cancels the job)."""

    def announce(self, text: str) -> None:
        print(f"notebook_launch: {text}", file=OUT, flush=True)


class SlurmTransport(RemoteTransport):
    """Ranks as srun steps of one held SLURM job, reached over their events connections (see the module)."""

    def __init__(self, options: LaunchOptions, cluster: "SlurmCluster") -> None:
        super().__init__()
        self.backend_name = "slurm, persistent"
        self.options, self.cluster = options, cluster
        self.launcher: SlurmLauncher | None = None   # the current ranks' (each start is a new job)
        self._per_node = 1
        self._names: list[str] = []                  # each node's name, by node rank

    @property
    def job_id(self) -> str | None:
        return self.launcher.job_id if self.launcher is not None else None

    @property
    def nodes(self) -> list[str]:
        """Where each rank runs, by global rank: "node N (name)"."""
        return [self._node(rank) for rank in range(len(self.processes))]

    def _node(self, rank: int) -> str:
        node_rank = rank // self._per_node
        return f"node {node_rank} ({self._names[node_rank]})"

    def start(self, logs_for: LogsFor) -> LaunchPlan:
        """Start the ranks as a SLURM launch does (``SlurmLauncher.start``, ``persistent=True``):
        a new allocation each start (fresh ranks after a loss are a new job)."""
        cluster, options = self.cluster, self.options
        world_size = options.num_processes or 0
        run_id = make_run_id()
        plan = cluster_plan(world_size, cluster.device_kind, options.mixed_precision, "slurm")
        check_display_ranks_exist(options.display_ranks, plan.world_size)
        logs = logs_for(plan, run_id)
        state = plan_state(plan, run_id, self.backend_name, logs.path)   # a failed start's LaunchError
        launcher = SlurmLauncher(cluster, run_id=run_id, mixed_precision=options.mixed_precision,
                                 rendezvous_timeout=options.rendezvous_timeout, persistent=True)
        launcher.folder = logs.path   # the pool's run folder: the nodes read the job there
        launcher.watch_start(Announcer())
        self.launcher = launcher
        self.start_through(launcher, plan, Job(serve_ray_calls, (cluster.device_kind,)), state)
        self._per_node = world_size // cluster.nodes
        self._names = [name for name, _ in launcher.nodes]
        return plan

    def where_lines(self, plan: LaunchPlan, where: str) -> tuple[str, ...]:
        return (request_summary(self.cluster, plan.world_size),
                f"notebook_launch: SLURM job {self.job_id} holds the ranks: {where}")

    def place(self, rank: int) -> tuple[int, int]:
        return rank % self._per_node, rank // self._per_node

    def lost_between_calls(self, gone: list[RankProcess], logs: RunLogs, num_processes: int) -> LostBetweenCalls:
        """A LaunchError naming the ranks lost, their node and what the scheduler says ended them
        (the job's time limit, a node failure, a preemption), before fresh ranks start with the
        next call."""
        for process in gone:
            process.poll()   # its end_note: what the scheduler says ended it
        lost = list(range(len(self.processes))) if self._job_over() else sorted(p.local_rank for p in gone)
        where = sorted({self._node(rank) for rank in lost})
        reason = next((p.end_note for p in gone if p.end_note), None) or "its node's srun step ended"
        return lost_between_calls_error(lost, where, reason, logs, num_processes,
                                        node_rank=lost[0] // self._per_node)

    def _job_over(self) -> bool:
        """Whether the job that held the ranks ended (then every rank is lost with it, though not
        every srun may have noticed yet)."""
        job_id = self.job_id
        try:
            return job_id is not None and not scheduler.job_info(job_id).live
        except (GuardError, OSError, subprocess.SubprocessError):
            log.debug("could not ask SLURM about job %s", job_id, exc_info=True)
            return False

    def end_ranks(self) -> None:
        """The launcher's end: the steps and the job cancelled and gone from the nodes, the
        watchdog let go."""
        super().end_ranks()
        self.launcher = None
