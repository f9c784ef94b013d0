"""Multi-node launches and restarts, on torch.distributed.elastic's agent.

Why this shape. Elastic's agent is ``SimpleElasticAgent``: it runs the
rendezvous, assigns group and global ranks, restarts the whole local group
after a failure while restarts remain (re-running the rendezvous each time),
and waits at an exit barrier. How workers are started, watched and stopped
is left to three abstract hooks (``_start_workers``, ``_monitor_workers``,
``_stop_workers``/``_shutdown``), which ``LocalElasticAgent`` fills with
elastic's own ``start_processes``. We fill them with notebook_launch's own
process layer instead -- the launcher interface (fork or spawn) running
``rank.runner.run_rank`` and the core supervisor (``AttemptSupervisor``) -- so
every guarantee of a single-node launch holds on each node: per-rank pipes
and fd-level output capture, log files, the run state the panel draws,
results and ERROR events over our channel, fail-fast teardown, interrupts.
Using ``LocalElasticAgent`` itself would have meant two owners of the same
processes (its monitor loop and ours), its signal handlers (installed by its
PContext and never restored), and output going to its log files.

What we add on top (see ``node_board`` and ``rendezvous``):
* a fresh TCPStore for the ranks on every attempt (group rank 0 picks a free
  port and posts it): elastic hands workers the agent's store, where a
  restarted attempt finds the previous attempt's keys -- with c10d on torch
  2.13 the restarted ranks hang in init_process_group;
* failures posted in the rendezvous store, so every node stops at once and
  names the same failing node and rank; success reported only once every
  node's ranks returned;
* interruptible, bounded rendezvous waits.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import TYPE_CHECKING, Any

from torch.distributed.elastic.agent.server.api import (  # noqa: E402  (torch is required here)
    RunResult, SimpleElasticAgent, WorkerSpec, WorkerState)

from ...errors.best_effort import best_effort
from ...channels import RankPipes
from ..base import end_started
from ...errors import LaunchError
from ...planning.net import free_port, interface_toward, is_loopback
from ...notebook.notebook_streams import OUT
from ...wire.plan import SOCKET_IFNAME_VARIABLES, LaunchPlan, available_cpus, rank_environment
from ...wire.protocol import Failure, FailureKind
from ...supervise import outcome
from ...supervise.supervisor import Step
from . import torch_compat
from .attempt import AttemptSupervisor
from .node_board import BoardUnreachable, NodeBoard
from .rendezvous import RendezvousFailed, create_handler

if TYPE_CHECKING:
    from ...scaffold.run import RunContext
    from ...rank.runner import Job
    from .rendezvous import RendezvousSettings

# torch types a WorkerGroup's rank, size, store and address Optional; every hook here runs
# after the rendezvous assigned them.
AssignedGroup = Any
AGENT_TICK = 0.001          # elastic sleeps this between monitor calls; our step() does the waiting
SECONDARY_GRACE = 5.0       # how long a node with a "connection closed" error waits for the real cause
WORKER_PORT_KEY = "notebook_launch/worker_port/{attempt}"
WORKER_PORT_WAIT = 60.0
LEAVE_WAIT = 10.0
EXIT_BARRIER_TIMEOUT = 60.0
log = logging.getLogger("notebook_launch")


class RunEnded(Exception):
    """Raised from inside the agent's loop to end the run without a restart."""

    def __init__(self, error: LaunchError) -> None:
        super().__init__(str(error))
        self.error = error


class NotebookElasticAgent(SimpleElasticAgent):
    """Elastic's agent with notebook_launch's process layer in its worker hooks."""

    def __init__(self, spec: WorkerSpec, run: "ElasticRun") -> None:
        super().__init__(spec, exit_barrier_timeout=EXIT_BARRIER_TIMEOUT)
        self.run_ctx = run
        self.sup: AttemptSupervisor | None = None
        self.pipes: list[RankPipes] = []
        self.board: NodeBoard | None = None
        self.failure: Failure | None = None   # the record that ended the latest attempt
        self.results: list[Any] | None = None

    @property
    def attempt(self) -> int:
        return torch_compat.attempt_number(self)

    # --- elastic's hooks -------------------------------------------------------
    def _start_workers(self, worker_group: AssignedGroup) -> dict[int, int]:
        ctx = self.run_ctx
        attempt = self.attempt
        port = self._agree_worker_port(worker_group, attempt)
        plan = attempt_plan(ctx.base_plan, worker_group, port, attempt=attempt, max_restarts=ctx.max_restarts,
                            run_id=ctx.run.state.run_id, rdzv_id=ctx.settings.run_id)
        ctx.begin_attempt(plan, attempt)
        self.board = NodeBoard(worker_group.store, node=worker_group.group_rank,
                               num_nodes=worker_group.group_world_size, attempt=attempt,
                               endpoint=ctx.settings.endpoint)
        self.failure = None
        self.pipes = []
        self.pipes = ctx.run.launcher.open_channels(plan)
        processes = ctx.run.launcher.start(plan, ctx.job, self.pipes)
        # Stall marking needs every rank in view: on several nodes, ranks waiting here may wait on
        # ranks working on another node, which this node cannot see (the timeout's verdict covers all).
        stall_after = ctx.run.options.stall_after if worker_group.group_world_size == 1 else None
        try:
            self.sup = AttemptSupervisor(processes, self.pipes, ctx.run.state, ctx.run.display, ctx.run.logs,
                                         timeout=ctx.timeout, poll_interval=ctx.poll_interval,
                                         rank_displays=ctx.run.rank_displays, stall_after=stall_after)
        except BaseException:   # an interrupt (or an error) before a supervisor holds the ranks
            end_started(processes)
            raise
        self.sup.board = self.board
        return self.sup.pids()

    def _monitor_workers(self, worker_group: AssignedGroup) -> RunResult:
        ctx, sup, board = self.run_ctx, self.sup, self.board
        assert sup is not None and board is not None
        status = sup.step(ctx.poll_interval)
        if status is Step.RUNNING and ctx.deadline is not None and time.monotonic() >= ctx.deadline:
            sup.time_out()
            status = Step.FAILED
        try:
            board.answer_where(sup.local_whereabouts, outcome.cell_labeller())   # a node diagnosing a hang asks
            if status is Step.FAILED:
                return self._after_local_failure(worker_group)
            remote = board.failure()
            if remote is not None:
                sup.stop(f"node {remote.node}{_rank_words(remote)} failed")
                return self._failed(remote)
            if status is Step.FINISHED:
                board.mark_done()
                if board.all_done():
                    self.results = sup.results
                    assert sup.results is not None
                    return RunResult(state=WorkerState.SUCCEEDED, return_values={
                        w.global_rank: value for w, value in zip(worker_group.workers, sup.results)})
        except BoardUnreachable as exc:
            sup.stop("contact with the other nodes was lost")
            raise RunEnded(outcome.lost_contact_error(exc, ctx.run.state)) from None
        return RunResult(state=WorkerState.HEALTHY)

    def _stop_workers(self, worker_group: AssignedGroup, *args: Any, **kwargs: Any) -> None:
        self.close_attempt()

    def _shutdown(self, death_sig: Any = None, timeout: int = 30, *args: Any, **kwargs: Any) -> None:
        self.close_attempt()

    # --- failures ------------------------------------------------------------------
    def _after_local_failure(self, worker_group: AssignedGroup) -> RunResult:
        sup, board = self.sup, self.board
        assert sup is not None and board is not None
        sup.close()
        record = sup.failure_record(node=worker_group.group_rank, attempt=self.attempt)
        if record.secondary and worker_group.group_world_size > 1:
            record = board.wait_for_failure(SECONDARY_GRACE) or record
        winner = board.publish_failure(record)
        if winner.same_as(record) and winner.node == worker_group.group_rank:
            self.run_ctx.local_error = sup.local_error()
        return self._failed(winner)

    def _failed(self, record: Failure) -> RunResult:
        self.failure = record
        ctx = self.run_ctx
        if not record.restartable:
            self.close_attempt()
            raise RunEnded(ctx.error_for(record))
        if torch_compat.remaining_restarts(self) > 0:
            print(outcome.restart_notice(record, self.attempt + 1, ctx.max_restarts,
                                         multi_node=ctx.settings.num_nodes > 1), file=OUT, flush=True)
        return RunResult(state=WorkerState.FAILED)

    # --- helpers -------------------------------------------------------------------
    def _agree_worker_port(self, worker_group: AssignedGroup, attempt: int) -> int:
        """A fresh store for the ranks of every attempt; see the module docstring."""
        store = worker_group.store
        key = WORKER_PORT_KEY.format(attempt=attempt)
        if worker_group.group_rank == 0:
            port = free_port()
            store.set(key, str(port))
            return port
        deadline = time.monotonic() + WORKER_PORT_WAIT
        while not store.check([key]):
            if time.monotonic() >= deadline:
                raise RendezvousFailed("node 0 did not post the port for the ranks' store in time")
            time.sleep(0.02)
        return int(store.get(key))

    def close_attempt(self) -> None:
        if self.sup is not None:
            self.sup.close()
        for pipes in self.pipes:
            pipes.close_all()
        self.pipes = []


def _rank_words(record: Failure) -> str:
    return f", rank {record.rank}" if record.rank is not None else ""


def attempt_plan(base: LaunchPlan, worker_group: AssignedGroup, port: int, *, attempt: int, max_restarts: int,
                 run_id: str, rdzv_id: str) -> LaunchPlan:
    """This node's ranks as elastic assigned them, each with ``plan.rank_environment`` for its
    place (the one writer of a rank's variables), laid over the base plan's: what the launch
    settled for this node and elastic does not change (NCCL switches for its GPUs, "lo" for a
    one-machine launch) stays."""
    master_addr = str(worker_group.master_addr)
    num_nodes = worker_group.group_world_size
    world_size = worker_group.workers[0].world_size
    # Both collectives bind to the interface that reaches rank 0's node (gloo and NCCL would
    # otherwise pick the first one up, e.g. docker0); a variable the user set wins.
    unset = any(name not in os.environ for name in SOCKET_IFNAME_VARIABLES)
    interface = None
    if num_nodes > 1 and unset and not is_loopback(master_addr):
        interface = interface_toward(master_addr)
    cpu_count = available_cpus()
    ranks = []
    for spec, worker in zip(base.ranks, worker_group.workers):
        env = rank_environment(
            global_rank=worker.global_rank, local_rank=worker.local_rank, num_processes=base.num_processes,
            num_nodes=num_nodes, node_rank=worker_group.group_rank, world_size=world_size,
            master_addr=master_addr, master_port=port, device_kind=base.device_kind,
            mixed_precision=base.mixed_precision, run_id=run_id, user_env=os.environ, cpu_count=cpu_count,
            restart_count=attempt, max_restarts=max_restarts, interface=interface, rdzv_id=rdzv_id,
            use_agent_store=False)
        ranks.append(dataclasses.replace(spec, global_rank=worker.global_rank, env={**spec.env, **env}))
    return dataclasses.replace(
        base, node_rank=worker_group.group_rank, num_nodes=num_nodes, world_size=world_size,
        master_addr=master_addr, master_port=port, ranks=tuple(ranks))


@dataclasses.dataclass(frozen=True)
class ElasticEnd:
    """How an elastic run ended on this node: its ranks' results, the error that ended it, or an
    interrupt (Ctrl-C or Stop; the other nodes were told)."""
    results: list[Any] | None = None
    error: LaunchError | None = None
    interrupted: bool = False


class ElasticRun:
    """Everything one elastic launch shares across attempts: the run scaffold's context,
    the job, the rendezvous settings, the deadline, and this node's own error."""

    def __init__(self, *, run: "RunContext", job: "Job", settings: "RendezvousSettings") -> None:
        self.run = run
        self.base_plan = run.plan
        self.job = job
        self.settings = settings
        self.max_restarts = run.options.max_restarts
        self.poll_interval = run.options.poll_interval
        self.timeout = run.options.timeout     # for the whole run, across attempts
        self.deadline = None if self.timeout is None else time.monotonic() + self.timeout
        self.local_error: LaunchError | None = None

    def begin_attempt(self, plan: LaunchPlan, attempt: int) -> None:
        self.local_error = None
        self.run.state.begin_attempt(attempt, node_rank=plan.node_rank, num_nodes=plan.num_nodes,
                                     world_size=plan.world_size, ranks=plan.ranks)
        if attempt > 0:
            for spec in plan.ranks:
                self.run.logs.write_line(spec.local_rank, "stdout",
                                         f"----- notebook_launch: restart {attempt} of {self.max_restarts} "
                                         f"(rank {spec.global_rank}) -----")

    def error_for(self, record: Failure) -> LaunchError:
        """The LaunchError for the failure that ended the run, as seen from this node."""
        if self.local_error is not None and record.node == self.run.state.node_rank:
            error = self.local_error
        else:
            error = outcome.remote_error(record, self.run.state)
        return outcome.with_attempts(error, record.attempt, self.max_restarts)

    def rendezvous_error(self, exc: Exception) -> LaunchError:
        text = str(exc) if isinstance(exc, RendezvousFailed) else (
            f"the {self.settings.backend} rendezvous at {self.settings.endpoint} failed: "
            f"{type(exc).__name__}: {exc}")
        return outcome.rendezvous_error(text, node_rank=self.settings.node_rank,
                                        num_nodes=self.settings.num_nodes, state=self.run.state)

    # --- the run ------------------------------------------------------------------
    def execute(self) -> "ElasticEnd":
        """Run the agent; return how the run ended: this node's results, one LaunchError, or interrupted.

        Exceptions are turned into values here so that nothing the caller raises
        keeps the agent, the handler or their TCPStore alive through a traceback
        (a live multi-tenant store server would keep the port busy)."""
        handler = None
        agent = None
        try:
            handler = create_handler(self.settings)
            static = self.settings.backend == "static"
            spec = WorkerSpec(
                role="default", local_world_size=self.base_plan.num_processes,
                entrypoint=self.job.function if hasattr(self.job.function, "__qualname__") else _rank,
                args=(), rdzv_handler=handler, max_restarts=self.max_restarts,
                monitor_interval=AGENT_TICK,
                master_addr=self.settings.host if static else None,
                master_port=self.settings.port if static else None)
            agent = NotebookElasticAgent(spec, self)
            result = agent.run()
            if result is None:   # elastic's "rendezvous gracefully exited"
                return ElasticEnd(error=self.rendezvous_error(RendezvousFailed("the rendezvous was closed")))
            if result.is_failed():
                assert agent.failure is not None
                return ElasticEnd(error=self.error_for(agent.failure))
            return ElasticEnd(results=agent.results)
        except RunEnded as ended:
            return ElasticEnd(error=ended.error)
        except KeyboardInterrupt:
            self._tell_others_interrupted(agent)
            return ElasticEnd(interrupted=True)
        except Exception as exc:
            if agent is not None and agent.sup is not None:
                raise
            return ElasticEnd(error=self.rendezvous_error(exc))
        finally:
            if agent is not None:
                agent.close_attempt()
                if agent.board is not None:
                    hosting = self.settings.is_host if self.settings.backend == "c10d" \
                        else self.settings.node_rank == 0
                    agent.board.leave(hosting=bool(hosting), wait=LEAVE_WAIT)
            if handler is not None:
                with best_effort("the rendezvous handler's shutdown failed"):
                    handler.shutdown()
            if agent is not None:
                torch_compat.drop_agent_store(agent)
                agent.board = None

    def _tell_others_interrupted(self, agent: NotebookElasticAgent | None) -> None:
        if agent is None or agent.board is None:
            return
        with best_effort("could not tell the other nodes about the interrupt"):
            agent.board.publish_failure(Failure(
                None, FailureKind.INTERRUPTED, "was interrupted (KeyboardInterrupt or the Stop button)",
                exc_type="KeyboardInterrupt", exc_message="", node=self.run.state.node_rank,
                attempt=agent.attempt, restartable=False))


def _rank() -> None:
    """Placeholder entrypoint name for elastic's events when the function has no __qualname__."""


def describe(settings: "RendezvousSettings", max_restarts: int) -> str:
    parts = [f"rendezvous: {settings.backend} at {settings.endpoint}",
             f"rdzv_timeout {settings.timeout:g} s"]
    if max_restarts:
        parts.append(f"max_restarts={max_restarts}")
    return "notebook_launch: " + ", ".join(parts)
