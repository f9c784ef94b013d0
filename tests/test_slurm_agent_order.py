"""The order in which a node's ranks are seen to end when SLURM kills their step (``slurm.agents.NodeAgent``).

SLURM kills a node's step for its ranks' memory together, agent and ranks in no set order. The run's
error must be the rank that grew (the one the agent last saw holding the most memory): so its end is
seen first, and the ranks that went with it only once the supervisor took it; both those the dying
agent never reported and those it saw SIGKILLed just before it died (CI saw the latter: the error
named rank 0, whose message said rank 1 grew past the job's memory). A rank killed alone, its agent
living on, is not held back for long.

What stands in for the step's ``srun`` here is a real process that prints the agent's report lines and
exits as srun does when its step is killed (``SrunStandIn``); no SLURM is needed."""
from __future__ import annotations

import os
import select
import subprocess
import sys
import time

import pytest

from notebook_launch.slurm import agents
from notebook_launch.slurm.agents import NodeAgent


def srun_stand_in(lines: list[str], then_exit: int | None, pause: float = 0.3, first: float = 0) -> subprocess.Popen:
    """A process printing ``lines`` (the agent's reports; ``first`` seconds after it started), then,
    after ``pause`` seconds, ending with ``then_exit`` (137: its step was killed) or, when None,
    living on until killed."""
    ending = f"time.sleep({pause}); sys.exit({then_exit})" if then_exit is not None else "time.sleep(600)"
    code = (f"import sys, time\ntime.sleep({first})\nfor line in {lines!r}:\n    print(line, flush=True)\n"
            f"{ending}\n")
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)


def readable(fd: int, wait: float) -> bool:
    return bool(select.select([fd], [], [], wait)[0])


@pytest.fixture
def node():
    def make(lines: list[str], then_exit: int | None, first: float = 0) -> tuple[NodeAgent, dict[int, int]]:
        agent = NodeAgent(0, range(2), srun_stand_in(lines, then_exit, first=first))
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
