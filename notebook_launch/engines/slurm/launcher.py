"""The SLURM launcher: one ``srun`` step per node of one allocation, whose agent forks the node's
ranks, started through the same ``Launcher`` interface as fork, spawn, xla and Ray
(``start(plan, job, channels) -> processes``).

``start`` asks for the allocation (``slurm.allocation``: ``salloc --no-shell``; while the job
waits in the queue its ``StartWatch`` is told, so every rank's row and the cell say "pending
(Resources)", and ticked, so Stop cancels it), writes the cloudpickled job into the run folder
(``folder``, set by the run: the nodes share the file system, as HPC homes are), opens
a listener on the notebook's address toward the first node and starts one ``srun`` per node, each
running ``engines.slurm.node_agent``: it imports torch (and DDP's modules, for training code:
``warm_modules``) once, then forks the node's ranks, each of which runs ``engines.slurm.task`` and
connects the rank's four streams back (``channels.sockets``, as Ray ranks do): those sockets are
the channels the supervisor selects on. Each rank's handle is an ``AgentRank`` (``slurm.agents``):
its end is what its agent reports on the step's stdout (its exit code or signal), or the step's
own end if the agent died with it, and a kill is SIGTERM to the node's srun, which has SLURM
cancel the step. ``end`` leaves nothing: the steps are cancelled, the job is scancelled and
waited for until SLURM no longer holds it, and the watchdog (``slurm.watchdog``), which cancels
the job if the notebook dies, is let go (``Allocation.release``). Like every launcher it only
starts processes: what it waits for, where each rank went and a failed start go to its watch and
as ``StartFailed`` (``engines.base``), never to the run state. Persistent ranks on SLURM
(``engines.slurm.persistent``) start through the same ``start`` with ``persistent=True``: each rank
serves calls until told to stop (``engines.remote.serve``) and its events connection carries calls
instead of signal frames (``agents.PersistentAgentRank``).

Each ``start`` is one attempt. A launch with ``max_restarts`` (``slurm.run``) sets ``hold_job``:
then ``end`` ends the attempt's steps only, the next ``start`` runs new steps in the same job (no
new request to the queue), with the attempt's restart count and a master port of its own
(``master_port_for``), and ``allocation.release()`` ends the job once the run is over. A job the
scheduler ended (``allocation.ended()``) takes no further attempt.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ...channels import RankPipes, RankProcess
from ...errors import GuardError
from ...planning.net import source_address_toward
from ...wire.protocol import FailureKind
from ..base import StartFailed
from ..remote.assignment import RankAssignment
from ..remote.launcher import ConnectBackLauncher
from ..local.warm_imports import TORCH_NAMES, looks_like_training, names_any
from ...diagnose.remote_where import WhereAsker
from .agents import AgentRank, NodeAgent, PersistentAgentRank
from .allocation import GONE_TIMEOUT, Allocation, reap
from .node_agent import NODE_VARIABLE
from .node_failure import NODE_FAILURE, NodeFailureOrder
from ..remote.handle import RankListener
from . import scheduler

if TYPE_CHECKING:
    from ...wire.plan import LaunchPlan
    from ...rank.runner import Job
    from .cluster import SlurmCluster

log = logging.getLogger("notebook_launch")


def master_port_for(job_id: str, attempt: int = 0) -> int:
    """Rank 0's store port on its node: Lightning's SLURM rule (15000 + the job id's last four
    digits), so two jobs sharing a node do not pick the same port, and nothing has to run on the
    node first to find one. A restart in the same job takes the next 10000 up (within 15000-64999),
    so its ranks meet on a fresh store, never on a port the last attempt's store held."""
    return 15000 + (int(job_id[-4:]) + 10000 * attempt) % 50000


class SlurmLauncher(ConnectBackLauncher):
    """Starts a plan's ranks (one row per global rank: ``plan.cluster_plan``) on a SLURM allocation."""

    name = "slurm"

    def __init__(self, cluster: "SlurmCluster", *, run_id: str, mixed_precision: str,
                 rendezvous_timeout: float, persistent: bool = False, max_restarts: int = 0,
                 timeout: float | None = None) -> None:
        """``timeout``: the launch's ``timeout=``, which counts the job's wait in the queue too (None:
        none; persistent ranks' calls have their own)."""
        self.cluster = cluster
        self.persistent = persistent   # the ranks serve calls until told to stop (persistent ranks)
        self.run_id = run_id
        self.job_name = f"notebook_launch-{run_id}"
        self.mixed_precision = mixed_precision
        self.rendezvous_timeout = rendezvous_timeout   # for the ranks' connections back, once granted
        self.python = cluster.python or sys.executable
        self.max_restarts = max_restarts
        self.timeout = timeout
        self.attempts = 0          # starts so far: each start is one attempt
        self.hold_job = False      # end() keeps the job for the next attempt; allocation.release() ends it
        # the run's folder, set by the run that made it before it starts: salloc's and each srun's
        # output and the shipped job (the nodes read it there: a shared file system)
        self.folder: Path | None = None
        self.allocation = Allocation(cluster, self.job_name)   # the job every attempt runs in
        self.nodes: list[tuple[str, str]] = []
        self._agents: list[NodeAgent] = []   # one per node, in node order
        self._outputs: dict[int, Path] = {}   # rank -> its node's srun output
        self._listener: RankListener | None = None
        self._payload_path: Path | None = None

    def start(self, plan: "LaunchPlan", job: "Job", channels: list[RankPipes]) -> list[RankProcess]:
        assert self.folder is not None, "the run sets the launcher's folder first"
        folder, world_size, cluster, watch = self.folder, plan.world_size, self.cluster, self.start_watch
        payload = self.payload_for(job)
        per_node = world_size // cluster.nodes
        attempt = self.attempts
        self.attempts += 1
        began, asked = time.monotonic(), self.job_id is None
        self.timeout_spent, self.timeout_note = 0.0, ""
        if asked:   # a restart runs in the job its first attempt was granted
            self.allocation.ask(watch, per_node, folder, self.timeout)
            self.nodes = self.allocation.nodes
        assert self.job_id is not None
        host = source_address_toward(self.nodes[0][1])
        if not host:
            raise GuardError(f"cannot tell which local address reaches the SLURM node {self.nodes[0][0]} "
                             f"({self.nodes[0][1]}); ranks could not send their output back to this notebook")
        self._payload_path = folder / "slurm-job.pkl"
        self._payload_path.write_bytes(payload)
        self._listener = listener = RankListener(host, world_size)
        # what every node's agent is told: where to connect and the job, what to import ahead, and
        # its first rank's assignment (the agent's children take the node's next ranks)
        common = {"host": host, "port": listener.address[1], "token": listener.token.hex(),
                  "payload": str(self._payload_path), "warm": warm_modules(job.function)}
        first = RankAssignment(
            global_rank=0, local_rank=0, local_world_size=per_node, node_rank=0, num_nodes=cluster.nodes,
            world_size=world_size, master_addr=self.nodes[0][1], master_port=master_port_for(self.job_id, attempt),
            device_kind=cluster.device_kind, mixed_precision=self.mixed_precision, run_id=self.run_id,
            cpu_count=cluster.cpus_per_rank * per_node, attempt=attempt, max_restarts=self.max_restarts,
            persistent=self.persistent)
        order = NodeFailureOrder()   # shared by the attempt's agents: a failed node's ranks end first
        for node_rank, (name, _) in enumerate(self.nodes):
            for rank in range(node_rank * per_node, (node_rank + 1) * per_node):
                watch.placed(rank, node_rank, name)
            node = dataclasses.replace(first, node_rank=node_rank, global_rank=node_rank * per_node)
            self._agents.append(self._start_agent(dict(common, rank=node.to_json()), name, per_node, order))
        agent_of = [agent for agent in self._agents for _ in agent.ranks]

        def check() -> None:
            watch.tick()
            self._check_none_ended_first(agent_of, listener, host)

        deadline = time.monotonic() + self.rendezvous_timeout
        pipes = self.accept(listener, deadline, check, host, channels)
        rank_type = PersistentAgentRank if self.persistent else AgentRank
        ranks = [rank_type(rank, agent, pipes[rank], self.end_cause) for rank, agent in enumerate(agent_of)]
        asker = WhereAsker(ranks)
        for process in ranks:
            process.where_asker = asker
        if asked:   # timeout= counts from the job's submission: its wait in the queue, then the start
            self.timeout_spent = time.monotonic() - began
            self.timeout_note = (f" ({self.allocation.queued:.0f} s of it pending in SLURM's queue, the rest "
                                 f"starting and running the ranks)")
        return list(ranks)

    def _check_none_ended_first(self, agent_of: list[NodeAgent], listener: RankListener, host: str) -> None:
        """A rank that ended before it connected fails the start: the interpreter or notebook_launch is
        missing on the node, the agent failed, or the rank could not reach the notebook."""
        for rank, agent in enumerate(agent_of):
            end = agent.ends.get(rank)
            if end is not None and not listener.connected(rank):
                status, by_agent = end
                said = self._srun_said(rank).strip()[-2000:]
                how = f"{'exit code' if status[0] == 'exit' else 'signal'} {status[1]}"
                raise StartFailed(
                    f"rank {rank} on {self.nodes[agent.node_rank][0]} ended ("
                    + (f"{how}" if by_agent else f"its node's srun step, exit code {agent.popen.returncode}")
                    + f") before it connected to the notebook at {host}. "
                    f"{missing_hint(said, self.python)}srun said:\n{said or '(nothing)'}",
                    rank=rank, kind=FailureKind.EXIT)

    def _start_agent(self, message: dict[str, Any], name: str, per_node: int,
                     order: NodeFailureOrder) -> NodeAgent:
        """The node's one step: its agent imports once and forks the node's ``per_node`` ranks
        (``engines.slurm.node_agent``). srun's stdout is the agent's reports; everything else it and the
        agent say goes to the node's output file (``end_cause`` and a failed start read it)."""
        assert self.folder is not None and self.job_id is not None
        node_rank = message["rank"]["node_rank"]
        env = dict(scheduler.slurm_environment(), **{NODE_VARIABLE: json.dumps(message)})
        attempt = message["rank"]["attempt"]   # each attempt's steps keep their own output
        output = self.folder / (f"srun-node{node_rank}" + (f"-attempt{attempt}" if attempt else "") + ".out")
        with open(output, "wb") as out:
            srun = subprocess.Popen(
                scheduler.agent_srun_argv(self.cluster, self.job_id, name, self.python, per_node), env=env,
                stdout=subprocess.PIPE, stderr=out, stdin=subprocess.DEVNULL, start_new_session=True)
        ranks = range(node_rank * per_node, (node_rank + 1) * per_node)
        for rank in ranks:
            self._outputs[rank] = output
        return NodeAgent(node_rank, ranks, srun, name=name, said=lambda: read_tail(output), order=order)

    def end_cause(self, rank: int, code: int) -> str | None:
        """Why the scheduler ended a rank we did not stop, if it did: asked when its srun failed or said
        something (srun ends with 0 after "Node failure on node1"). A step killed for its memory is
        said by srun alone (the job runs on). A rank SLURM killed may end before ``scontrol`` records
        the job's end: then it is asked again for up to ``allocation.END_RECORDED`` seconds."""
        said = self._srun_said(rank)
        if self.job_id is None or not (code or said):
            return None
        memory = scheduler.step_memory_cause(said)
        if memory is not None:   # the node's step ended for its ranks' memory together: whose?
            culprit = next((a.culprit() for a in self._agents if rank in a.ranks), None)
            if culprit is not None and culprit != rank:
                return f"its node's step ended with rank {culprit}, which grew past the job's memory: {memory}"
            return memory
        node_failure = NODE_FAILURE.search(said)
        cause = self.allocation.scheduler_cause(signalled=code > 128 or node_failure is not None)
        if cause is None and node_failure is not None:   # the scheduler forgot the job already
            cause = f"SLURM reported a node failure ({node_failure.group(0)})"
        if cause is not None:   # the scheduler ended the job (its record may say so only later)
            self.allocation.ended_by = cause
        return cause

    def _srun_said(self, rank: int) -> str:
        return read_tail(self._outputs[rank]) if rank in self._outputs else ""

    def end(self) -> None:
        """Leave nothing of the attempt: the listener closed, every step cancelled and gone from the
        nodes, srun reaped; unless ``hold_job`` (a restart may follow), nothing of the job either
        (``release``)."""
        try:
            self.close_listener()
            for agent in self._agents:
                agent.kill()
            if not self.hold_job:
                self.allocation.cancel()
            for agent in self._agents:
                reap(agent.popen)
            for agent in self._agents:
                agent.close(GONE_TIMEOUT)
        finally:
            if self._payload_path is not None:
                self._payload_path.unlink(missing_ok=True)
            self._agents = []
            if not self.hold_job:
                self.allocation.release()

    @property
    def job_id(self) -> str | None:
        return self.allocation.job_id



def warm_modules(function: Callable[..., Any]) -> list[str]:
    """What each node's agent imports before it forks the ranks: torch when the launched code names
    it, and what DDP's constructor and an optimizer step import when it looks like training (the
    local fork backend's test, ``engines.local.warm_imports``); nothing heavy for code that needs none."""
    try:
        if not names_any(function, TORCH_NAMES):
            return []
        training = looks_like_training(function)
    except Exception:   # why: an odd callable: its ranks import what they need
        log.debug("could not read the launched function's code", exc_info=True)
        return []
    return ["torch", "torch.distributed"] + (["torch.nn.parallel", "torch._dynamo"] if training else [])


def read_tail(output: Path) -> str:
    """The last words of a node step's output file: what srun and the step said."""
    try:
        return output.read_text(errors="replace")[-4000:]
    except OSError:
        return ""


def missing_hint(said: str, python: str) -> str:
    if "execve" in said or "No such file" in said:
        return (f"The notebook's Python ({python}) is not on that node at the same path: the nodes must share "
                f"the notebook's environment (a venv or conda env on a shared file system), or give "
                f"SlurmCluster(python=...) the interpreter to use there. ")
    if "No module named" in said:
        return "notebook_launch is not importable on that node with the notebook's Python and PYTHONPATH. "
    return ""


