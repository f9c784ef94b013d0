"""Multi-node launches and restarts, on torch.distributed.elastic's agent.

Why this shape. Elastic's agent is ``SimpleElasticAgent``: it runs the
rendezvous, assigns group and global ranks, restarts the whole local group
after a failure while restarts remain (re-running the rendezvous each time),
and waits at an exit barrier. How workers are started, watched and stopped
is left to three abstract hooks (``_start_workers``, ``_monitor_workers``,
``_stop_workers``/``_shutdown``), which ``LocalElasticAgent`` fills with
elastic's own ``start_processes``. We fill them with notebook_launch's own
process layer instead -- the launcher's backend (fork) running
``worker.run_rank`` and the core supervisor (``AttemptSupervisor``) -- so
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
import os
import time

from ..errors import LaunchError
from ..network import interface_toward, is_loopback
from ..node_board import BoardUnreachable, NodeBoard
from ..plan import free_port
from ..rendezvous import RendezvousFailed, create_handler
from ..state import DONE, FAILED, STARTING
from .attempt import AttemptSupervisor
from .base import RankPipes

from torch.distributed.elastic.agent.server.api import (  # noqa: E402  (torch is required here)
    RunResult, SimpleElasticAgent, WorkerSpec, WorkerState)

AGENT_TICK = 0.001          # elastic sleeps this between monitor calls; our step() does the waiting
SECONDARY_GRACE = 5.0       # how long a node with a "connection closed" error waits for the real cause
WORKER_PORT_KEY = "notebook_launch/worker_port/{attempt}"
WORKER_PORT_WAIT = 60.0
LEAVE_WAIT = 10.0
EXIT_BARRIER_TIMEOUT = 60.0


class RunEnded(Exception):
    """Raised from inside the agent's loop to end the run without a restart."""

    def __init__(self, error: LaunchError):
        super().__init__(str(error))
        self.error = error


class NotebookElasticAgent(SimpleElasticAgent):
    """Elastic's agent with notebook_launch's process layer in its worker hooks."""

    def __init__(self, spec: WorkerSpec, run: "ElasticRun"):
        super().__init__(spec, exit_barrier_timeout=EXIT_BARRIER_TIMEOUT)
        self.run_ctx = run
        self.sup: AttemptSupervisor | None = None
        self.pipes = []
        self.board: NodeBoard | None = None
        self.failure: dict | None = None     # the record that ended the latest attempt
        self.results = None

    @property
    def attempt(self) -> int:
        return self._worker_group.spec.max_restarts - self._remaining_restarts

    # --- elastic's hooks -------------------------------------------------------
    def _start_workers(self, worker_group):
        ctx = self.run_ctx
        attempt = self.attempt
        port = self._agree_worker_port(worker_group, attempt)
        plan = ctx.plan_for(worker_group, port, attempt)
        ctx.begin_attempt(plan, attempt)
        self.board = NodeBoard(worker_group.store, node=worker_group.group_rank,
                               num_nodes=worker_group.group_world_size, attempt=attempt,
                               endpoint=ctx.settings.endpoint)
        self.failure = None
        self.pipes = [RankPipes.open() for _ in plan.ranks]
        processes = ctx.backend.start(plan, ctx.job, self.pipes)
        self.sup = AttemptSupervisor(plan, processes, self.pipes, ctx.state, ctx.display, ctx.logs,
                                     timeout=ctx.timeout, poll_interval=ctx.poll_interval)
        return self.sup.pids()

    def _monitor_workers(self, worker_group) -> RunResult:
        ctx, sup = self.run_ctx, self.sup
        status = sup.step(ctx.poll_interval)
        if status not in (DONE, FAILED) and ctx.deadline is not None \
                and time.monotonic() >= ctx.deadline:
            sup.time_out()
            status = FAILED
        try:
            if status == FAILED:
                return self._after_local_failure(worker_group)
            remote = self.board.failure()
            if remote is not None:
                sup.stop(f"node {remote['node']}{_rank_words(remote)} failed")
                return self._failed(remote)
            if status == DONE:
                self.board.mark_done()
                if self.board.all_done():
                    self.results = sup.results
                    return RunResult(state=WorkerState.SUCCEEDED, return_values={
                        w.global_rank: value for w, value in zip(worker_group.workers, sup.results)})
        except BoardUnreachable as exc:
            sup.stop("contact with the other nodes was lost")
            raise RunEnded(ctx.lost_contact_error(exc)) from None
        return RunResult(state=WorkerState.HEALTHY)

    def _stop_workers(self, worker_group) -> None:
        self._close_attempt()

    def _shutdown(self, death_sig=None, timeout: int = 30) -> None:
        self._close_attempt()

    # --- failures ------------------------------------------------------------------
    def _after_local_failure(self, worker_group) -> RunResult:
        sup = self.sup
        sup.close()
        record = sup.failure_record(node=worker_group.group_rank, attempt=self.attempt)
        if record["secondary"] and worker_group.group_world_size > 1:
            record = self.board.wait_for_failure(SECONDARY_GRACE) or record
        winner = self.board.publish_failure(record)
        if _same_failure(winner, record) and winner["node"] == worker_group.group_rank:
            self.run_ctx.local_error = sup.local_error(sup.results_after_close())
        return self._failed(winner)

    def _failed(self, record: dict) -> RunResult:
        self.failure = record
        ctx = self.run_ctx
        if not record.get("restartable", True):
            self._close_attempt()
            raise RunEnded(ctx.error_for(record, self))
        if self._remaining_restarts > 0:
            ctx.announce_restart(record, self.attempt + 1)
        return RunResult(state=WorkerState.FAILED)

    # --- helpers -------------------------------------------------------------------
    def _agree_worker_port(self, worker_group, attempt: int) -> int:
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

    def _close_attempt(self) -> None:
        if self.sup is not None:
            self.sup.close()
        for pipes in self.pipes:
            pipes.close_parent_ends()
            pipes.close_child_ends()
        self.pipes = []


def _rank_words(record: dict) -> str:
    return f", rank {record['rank']}" if record.get("rank") is not None else ""


def _same_failure(a: dict, b: dict) -> bool:
    return all(a.get(k) == b.get(k) for k in ("node", "rank", "headline", "attempt"))


class ElasticRun:
    """Everything one elastic launch shares across attempts (and the agent)."""

    def __init__(self, *, plan, job, backend, settings, max_restarts, state, display, logs,
                 poll_interval, timeout):
        self.base_plan = plan
        self.job = job
        self.backend = backend
        self.settings = settings
        self.max_restarts = max_restarts
        self.state = state
        self.display = display
        self.logs = logs
        self.poll_interval = poll_interval
        self.timeout = timeout     # for the whole run, across attempts
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.local_error: LaunchError | None = None
        self.agent: NotebookElasticAgent | None = None

    # --- plans -----------------------------------------------------------------
    def plan_for(self, worker_group, port: int, attempt: int):
        """This node's ranks as elastic assigned them, with the environment elastic gives workers."""
        base = self.base_plan
        multi_node = worker_group.group_world_size > 1
        iface = None
        if multi_node and "GLOO_SOCKET_IFNAME" not in os.environ and not is_loopback(worker_group.master_addr):
            iface = interface_toward(worker_group.master_addr)
        ranks = []
        for spec, worker in zip(base.ranks, worker_group.workers):
            env = dict(spec.env)
            env.update({
                "RANK": str(worker.global_rank), "LOCAL_RANK": str(worker.local_rank),
                "WORLD_SIZE": str(worker.world_size), "GROUP_RANK": str(worker_group.group_rank),
                "NODE_RANK": str(worker_group.group_rank),
                "GROUP_WORLD_SIZE": str(worker_group.group_world_size),
                "ROLE_RANK": str(worker.role_rank), "ROLE_WORLD_SIZE": str(worker.role_world_size),
                "MASTER_ADDR": str(worker_group.master_addr), "MASTER_PORT": str(port),
                "NOTEBOOK_LAUNCH_RANK": str(worker.global_rank),
                "TORCHELASTIC_RESTART_COUNT": str(attempt),
                "TORCHELASTIC_MAX_RESTARTS": str(self.max_restarts),
                "TORCHELASTIC_RUN_ID": self.settings.run_id,
                "TORCHELASTIC_USE_AGENT_STORE": str(False),
                "TORCH_NCCL_ASYNC_ERROR_HANDLING": os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
            })
            if iface:
                env["GLOO_SOCKET_IFNAME"] = iface
            ranks.append(dataclasses.replace(spec, global_rank=worker.global_rank, env=env))
        return dataclasses.replace(
            base, node_rank=worker_group.group_rank, num_nodes=worker_group.group_world_size,
            world_size=worker_group.workers[0].world_size, master_addr=str(worker_group.master_addr),
            master_port=port, ranks=tuple(ranks))

    def begin_attempt(self, plan, attempt: int) -> None:
        state = self.state
        self.local_error = None
        state.attempt = attempt
        state.node_rank, state.num_nodes, state.world_size = plan.node_rank, plan.num_nodes, plan.world_size
        for rs, spec in zip(state.ranks, plan.ranks):
            rs.rank, rs.status, rs.pid = spec.global_rank, STARTING, None
            rs.bars, rs.metrics = {}, {}
            rs.exit_description = rs.error = None
        if attempt > 0:
            for spec in plan.ranks:
                self.logs.write_line(spec.local_rank, "stdout",
                                     f"----- notebook_launch: restart {attempt} of {self.max_restarts} "
                                     f"(rank {spec.global_rank}) -----")

    # --- messages ----------------------------------------------------------------
    def announce_restart(self, record: dict, next_attempt: int) -> None:
        who = f"node {record['node']}{_rank_words(record)}" if self.settings.num_nodes > 1 \
            else f"rank {record['rank']}"
        print(f"notebook_launch: {who} failed ({record['headline']}); restarting every rank "
              f"(restart {next_attempt} of {self.max_restarts})", flush=True)

    def error_for(self, record: dict, agent) -> LaunchError:
        """The LaunchError for the failure that ended the run, as seen from this node."""
        if self.local_error is not None and record.get("node") == self.state.node_rank:
            error = self.local_error
        else:
            error = self._remote_error(record)
        if self.max_restarts > 0:
            used = record.get("attempt", agent.attempt if agent else 0)
            note = (f"\nAttempt {used + 1} of {self.max_restarts + 1}: "
                    f"{'no restarts left' if used >= self.max_restarts else 'not restarted'} "
                    f"(max_restarts={self.max_restarts}).")
            error.args = (error.args[0] + note,)
        return error

    def _remote_error(self, record: dict) -> LaunchError:
        state = self.state
        node, rank = record.get("node"), record.get("rank")
        first = f"node {node}{_rank_words(record)} failed: {record['headline']}"
        if rank is None:
            first = f"node {node}: {record['headline']}"
        lines = [first]
        if record.get("traceback"):
            lines += ["", f"Traceback from rank {rank} (node {node}):", record["traceback"].rstrip()]
        lines += ["", f"Ranks on this node (node {state.node_rank}):"]
        for rs in state.ranks:
            lines.append(f"  rank {rs.rank}: {rs.exit_description or rs.status}")
        lines.append(f"Logs of this node: {state.log_dir} (node {node} has its own)")
        state.finish(FAILED, first)
        return LaunchError("\n".join(lines), rank=rank, node_rank=node, kind=record.get("kind", "exception"),
                           exc_type=record.get("exc_type"), exc_message=record.get("exc_message"),
                           remote_traceback=record.get("traceback") or None, log_dir=state.log_dir,
                           results=[None] * len(state.ranks))

    def lost_contact_error(self, exc: Exception) -> LaunchError:
        message = f"node {self.state.node_rank}: {exc}. This node's ranks were stopped."
        self.state.finish(FAILED, message.splitlines()[0])
        return LaunchError(message, kind="rendezvous", node_rank=self.state.node_rank,
                           log_dir=self.state.log_dir, results=[None] * len(self.state.ranks))

    def rendezvous_error(self, exc: Exception) -> LaunchError:
        text = str(exc) if isinstance(exc, RendezvousFailed) else (
            f"the {self.settings.backend} rendezvous at {self.settings.endpoint} failed: "
            f"{type(exc).__name__}: {exc}")
        message = (f"notebook_launch: {text}\nNo rank was started on this node "
                   f"(node_rank={self.settings.node_rank}, num_nodes={self.settings.num_nodes}).")
        self.state.finish(FAILED, text.splitlines()[0] if text else type(exc).__name__)
        return LaunchError(message, kind="rendezvous", node_rank=self.settings.node_rank,
                           log_dir=self.state.log_dir, results=[None] * len(self.state.ranks))

    # --- the run ------------------------------------------------------------------
    def execute(self):
        """Run the agent; return ("results", list) or ("error", LaunchError) or ("interrupt", None).

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
            agent = self.agent = NotebookElasticAgent(spec, self)
            result = agent.run()
            if result is None:   # elastic's "rendezvous gracefully exited"
                return "error", self.rendezvous_error(RendezvousFailed("the rendezvous was closed"))
            if result.is_failed():
                return "error", self.error_for(agent.failure, agent)
            self.state.finish(DONE, f"{self.base_plan.num_processes} ranks finished in "
                                    f"{self.state.elapsed:.1f} s")
            return "results", agent.results
        except RunEnded as ended:
            return "error", ended.error
        except KeyboardInterrupt:
            self._tell_others_interrupted(agent)
            return "interrupt", None
        except Exception as exc:
            if agent is not None and agent.sup is not None:
                raise
            return "error", self.rendezvous_error(exc)
        finally:
            if agent is not None:
                agent._close_attempt()
                if agent.board is not None:
                    hosting = self.settings.is_host if self.settings.backend == "c10d" \
                        else self.settings.node_rank == 0
                    agent.board.leave(hosting=bool(hosting), wait=LEAVE_WAIT)
            if handler is not None:
                try:
                    handler.shutdown()
                except Exception:
                    pass
            if agent is not None:
                agent._store = None
                agent._worker_group.store = None
                agent.board = None
            self.agent = None

    def _tell_others_interrupted(self, agent) -> None:
        if agent is None or agent.board is None:
            return
        try:
            agent.board.publish_failure({
                "node": self.state.node_rank, "rank": None, "kind": "interrupted",
                "headline": "was interrupted (KeyboardInterrupt or the Stop button)",
                "traceback": "", "exc_type": "KeyboardInterrupt", "exc_message": "",
                "attempt": agent.attempt, "restartable": False, "secondary": False})
        except Exception:
            pass


def _rank():
    """Placeholder entrypoint name for elastic's events when the function has no __qualname__."""


def describe(settings, max_restarts: int) -> str:
    parts = [f"rendezvous: {settings.backend} at {settings.endpoint}",
             f"rdzv_timeout {settings.timeout:g} s"]
    if max_restarts:
        parts.append(f"max_restarts={max_restarts}")
    return "notebook_launch: " + ", ".join(parts)
