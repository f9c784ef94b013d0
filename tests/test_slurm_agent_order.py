"""The order in which a node's ranks are seen to end when SLURM kills their step (``slurm.agents.NodeAgent``).

SLURM kills a node's step for its ranks' memory together, agent and ranks in no set order. The run's
error must be the rank that grew (the one the agent last saw holding the most memory): so its end is
seen first, and the ranks that went with it only once the supervisor took it; both those the dying
agent never reported and those it saw SIGKILLed just before it died (CI saw the latter: the error
named rank 0, whose message said rank 1 grew past the job's memory). A rank killed alone, its agent
living on, is not held back for long. And when SLURM ends the job because a node failed, the ranks
of the failed node are seen to end before those of the healthy nodes' steps it cancelled (the error
named rank 0, on the node that lived on, in one CI rehearsal of six: ``slurm.node_failure``).

What stands in for the step's ``srun`` here is a real process that prints the agent's report lines and
exits as srun does when its step is killed (``SrunStandIn``); no SLURM is needed."""
from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from notebook_launch.engines.slurm import agents
from notebook_launch.engines.slurm.agents import NodeAgent
from notebook_launch.engines.slurm import node_failure
from notebook_launch.engines.slurm.node_failure import NodeFailureOrder


def srun_stand_in(lines: list[str], then_exit: int | None, pause: float = 0.3, first: float = 0,
                  says: str = "", output: Path | None = None) -> subprocess.Popen:
    """A process printing ``lines`` (the agent's reports; ``first`` seconds after it started), then,
    after ``pause`` seconds, writing ``says`` to its stderr (``output``, srun's output file) and
    ending with ``then_exit`` (137: its step was killed) or, when None, living on until killed."""
    ending = f"sys.exit({then_exit})" if then_exit is not None else "time.sleep(600)"
    code = (f"import sys, time\ntime.sleep({first})\nfor line in {lines!r}:\n    print(line, flush=True)\n"
            f"time.sleep({pause})\nsys.stderr.write({says!r}); sys.stderr.flush()\n{ending}\n")
    with open(output or os.devnull, "ab") as err:
        return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=err,
                                stdin=subprocess.DEVNULL)


def readable(fd: int, wait: float) -> bool:
    return bool(select.select([fd], [], [], wait)[0])


@pytest.fixture
def node(tmp_path):
    def make(lines: list[str], then_exit: int | None, first: float = 0, *, node_rank: int = 0, says: str = "",
             pause: float = 0.3, order: NodeFailureOrder | None = None) -> tuple[NodeAgent, dict[int, int]]:
        output = tmp_path / f"srun-node{node_rank}.out"
        ranks = range(2 * node_rank, 2 * node_rank + 2)
        agent = NodeAgent(node_rank, ranks, srun_stand_in(lines, then_exit, pause, first, says, output),
                          name=f"node{node_rank}", said=output.read_text, order=order)
        made.append((agent, {rank: agent.sentinel(rank) for rank in agent.ranks}))
        return made[-1]

    made: list[tuple[NodeAgent, dict[int, int]]] = []
    yield make
    for agent, sentinels in made:
        if agent.popen.poll() is None:
            agent.popen.kill()
        agent.popen.wait()
        agent.close(10)
        for sentinel in sentinels.values():   # the sentinels' holder closes them (the rank, here the test)
            os.close(sentinel)


@pytest.mark.parametrize("reported", [[], ["0 signal 9"]], ids=["agent-died-first", "agent-saw-rank-0-killed"])
def test_the_rank_that_grew_is_seen_first_and_the_rest_only_once_it_was_taken(node, reported):
    agent, sentinels = node(["1 largest 700000000", *reported], then_exit=137)
    assert readable(sentinels[1], 30), "the rank that grew ends"
    assert agent.ends[1] == (("signal", 9), False)
    assert not readable(sentinels[0], 1.0), "rank 0 waits behind rank 1 until its end was taken"
    agent.taken(1)
    assert readable(sentinels[0], 5)
    assert agent.ends[0] == (("signal", 9), bool(reported))


def test_a_rank_the_agent_saw_killed_alone_ends_after_the_grace(node, monkeypatch):
    """The agent lives on (SLURM did not kill the step: the kernel's OOM killer or a user's kill took
    rank 0 alone): rank 0 is released once the grace passed, though rank 1 ended not at all."""
    monkeypatch.setattr(agents, "KILLED_WITH_THE_STEP_WITHIN", 0.5)
    agent, sentinels = node(["1 largest 700000000", "0 signal 9"], then_exit=None)
    started = time.monotonic()
    assert readable(sentinels[0], 30)
    assert time.monotonic() - started >= 0.4
    assert agent.ends[0] == (("signal", 9), True)
    assert not readable(sentinels[1], 0.2)


@pytest.mark.parametrize("line", ["1 signal 9", "0 exit 1", "0 signal 11"])
def test_other_ends_the_agent_reports_are_seen_at_once(node, line):
    """The rank that grew being killed, a rank's own exit or crash: nothing to wait for."""
    agent, sentinels = node(["1 largest 700000000", line], then_exit=None)
    rank = int(line.split()[0])
    assert readable(sentinels[rank], 2), "well within the grace a held-back kill gets"


def test_ends_the_notebook_caused_are_not_held_back(node):
    """The notebook ended the step itself (``kill``): no rank's end waits for another's."""
    agent, sentinels = node(["1 largest 700000000", "0 signal 9"], then_exit=None, first=0.5)
    agent.killed = True   # as ``kill`` marks it, before the agent's report comes
    assert readable(sentinels[0], 2), "well within the grace a held-back kill gets"
    assert not readable(sentinels[1], 0.2)


# what srun printed on each node when node1 died (tests/slurmcluster's node failure test)
CANCELLED = ("slurmstepd-node0: error: *** STEP 1.0 ON node0 CANCELLED AT 2026-11-27T04:38:05 DUE TO NODE "
             "FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***\nsrun: error: node0: task 0: Terminated\n")
FAILED = "srun: error: Node failure on node1\n"


def test_a_failed_nodes_ranks_are_seen_before_those_of_the_steps_slurm_cancelled_for_it(node):
    """node0's srun ends first (its step cancelled), node1's a second later: rank 0 and 1 wait until a
    rank of node1 was taken, then end at once."""
    order = NodeFailureOrder()
    healthy, healthy_ends = node([], then_exit=143, node_rank=0, says=CANCELLED, pause=0, order=order)
    failed, failed_ends = node([], then_exit=0, node_rank=1, says=FAILED, pause=1.0, order=order)
    assert readable(failed_ends[2], 30), "the failed node's ranks end"
    assert not any(readable(healthy_ends[rank], 0.5) for rank in (0, 1)), "node0's wait behind node1's"
    assert healthy.popen.poll() == 143, "though node0's srun ended first"
    failed.taken(2)
    assert all(readable(healthy_ends[rank], 5) for rank in (0, 1))
    assert healthy.ends[0] == (("signal", 15), False)


def test_a_cancelled_step_waits_for_no_failed_node_that_never_says_so(node, monkeypatch):
    """No srun of the launch says its node failed (it printed nothing yet, or its words were lost):
    node0's ranks end once ``FAILED_NODE_WITHIN`` passed."""
    monkeypatch.setattr(node_failure, "FAILED_NODE_WITHIN", 1.0)
    order = NodeFailureOrder()
    healthy, ends = node([], then_exit=143, node_rank=0, says=CANCELLED, pause=0, order=order)
    node([], then_exit=None, node_rank=1, order=order)
    while healthy.popen.poll() is None:
        time.sleep(0.01)
    ended = time.monotonic()
    assert readable(ends[0], 30)
    assert time.monotonic() - ended >= 0.9


@pytest.mark.parametrize("says", ["", CANCELLED + FAILED.replace("node1", "node0"),
                                  "srun: error: node0: task 0: Terminated\n"],
                         ids=["said-nothing", "cancelled-for-its-own-failure", "terminated-alone"])
def test_a_step_that_was_not_cancelled_for_another_node_ends_at_once(node, says):
    """Only SLURM's cancel for another node's failure holds a node's ranks back."""
    _, ends = node([], then_exit=143, node_rank=0, says=says, pause=0, order=NodeFailureOrder())
    assert readable(ends[0], 2), "well within FAILED_NODE_WITHIN"


def test_the_notebook_ending_the_steps_holds_nothing_back(node):
    """node0's ranks wait behind node1's (as above) when the notebook ends the steps itself (``kill``:
    its teardown, or ``end``): they end at once."""
    order = NodeFailureOrder()
    healthy, ends = node([], then_exit=143, node_rank=0, says=CANCELLED, pause=0, order=order)
    failed, _ = node([], then_exit=None, node_rank=1, order=order)
    while healthy.popen.poll() is None:
        time.sleep(0.01)
    assert not readable(ends[0], 0.5), "node0's ranks wait behind node1's"
    failed.kill()
    assert readable(ends[0], 2), f"well within FAILED_NODE_WITHIN ({node_failure.FAILED_NODE_WITHIN:g} s)"
