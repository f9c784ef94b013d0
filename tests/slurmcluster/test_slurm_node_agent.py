"""A node's ranks on SLURM are forked by one agent per node (``slurm.node_agent``), which imported
torch (and DDP's modules, for training code) once before the fork; code that never names torch
gets nothing heavy. The notebook learns each forked rank's true end from its agent: a signal, an
exit code, as a rank's own process would say it.
"""
from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from test_slurm_launch import (SETUP, SLEEPERS_REPORTING, assert_nothing_left, launch_error, run_notebook,
                               wait_for_lines)

pytestmark = pytest.mark.timeout(300)


def test_a_nodes_ranks_are_forked_by_one_agent_that_imported_torch_once(slurm):
    result, _ = run_notebook(slurm, """
def train():
    before = sorted(m for m in ("torch", "torch.distributed", "torch.nn.parallel", "torch._dynamo") if m in sys.modules)
    parent = os.getppid()
    with open(f"/proc/{parent}/cmdline", "rb") as f:
        parent_command = f.read().replace(bytes(1), b" ").decode()
    import ctypes, torch
    torch.nn.parallel.DistributedDataParallel   # training code: DDP's modules are imported before the fork
    death_signal = ctypes.c_int()
    ctypes.CDLL(None).prctl(2, ctypes.byref(death_signal), 0, 0, 0)   # PR_GET_PDEATHSIG
    return {"rank": int(os.environ["RANK"]), "host": socket.gethostname(), "pid": os.getpid(), "parent": parent,
            "parent_command": parent_command, "imported_before": before, "death_signal": death_signal.value}
def plain():
    return sorted(m for m in ("torch", "torch._dynamo") if m in sys.modules)
training = notebook_launcher(train, num_processes=4, cluster=SlurmCluster(nodes=2), ui="none")
print(json.dumps({"training": training,
                  "plain": notebook_launcher(plain, num_processes=4, cluster=SlurmCluster(nodes=2), ui="none")}))
""")
    ranks = result["training"]
    assert [r["host"] for r in ranks] == ["node0", "node0", "node1", "node1"]
    parents = [r["parent"] for r in ranks]
    assert parents[0] == parents[1] and parents[2] == parents[3] and parents[0] != parents[2], ranks
    assert len({r["pid"] for r in ranks} | set(parents)) == 6   # four ranks, two agents
    assert all("-m notebook_launch.engines.slurm.node_agent" in r["parent_command"] for r in ranks), ranks
    assert {r["death_signal"] for r in ranks} == {signal.SIGKILL}   # a rank never outlives its agent
    # at the function's first line each rank has torch and DDP's modules already: its agent imported them
    assert all(r["imported_before"] == ["torch", "torch._dynamo", "torch.distributed", "torch.nn.parallel"]
               for r in ranks), ranks
    assert result["plain"] == [[], [], [], []]   # code that never names torch: the agent imports none of it
    assert_nothing_left(slurm)


@pytest.mark.parametrize("ending, said", [
    ("os.kill(os.getpid(), signal.SIGSEGV)", "killed by SIGSEGV"),
    ("os.kill(os.getpid(), signal.SIGKILL)", "killed by SIGKILL"),
    ("os._exit(7)", "exit code 7"),
], ids=["sigsegv", "sigkill", "exit-code"])
def test_a_forked_ranks_own_ending_is_reported(slurm, ending, said):
    """Rank 3 (node1) ends by a signal or an exit code while rank 2, forked by the same agent,
    sleeps: the error names rank 3 and how it ended (the agent's report of its wait status), and
    rank 2 is stopped by the run, not taken for the failure."""
    error, _ = launch_error(slurm, f"""
def train():
    import os, signal, time
    if os.environ["RANK"] == "3":
        time.sleep(1)
        {ending}
    time.sleep(600)
notebook_launcher(train, num_processes=4, cluster=SlurmCluster(nodes=2), ui="none")
""")
    assert error["rank"] == 3, error
    assert error["kind"] == ("exit" if "exit" in ending else "signal"), error
    first = error["message"].splitlines()[0]
    assert f"rank 3 failed: {said}" in first, error["message"]
    assert "rank 2 (node 1 (node1)): stopped by notebook_launch (SIGTERM) after rank 3 failed" in error["message"], \
        error["message"]
    assert_nothing_left(slurm)


def test_a_killed_agent_takes_its_ranks_with_it(slurm):
    """node1's agent is SIGKILLed while its ranks run: they die with it (PR_SET_PDEATHSIG, and SLURM
    ends the step), the run fails naming one of them, killed by SIGKILL, and nothing is left."""
    proc = slurm.notebook(SETUP + SLEEPERS_REPORTING)
    try:
        wait_for_lines(proc, "] running", 4)
        agent = node_agent_pid(slurm, 1)
        os.kill(agent, signal.SIGKILL)
        out, err = proc.communicate(timeout=180)
        error = json.loads(out.strip().splitlines()[-1])
        assert error["type"] == "LaunchError", (out, err)
        assert error["rank"] in (2, 3) and error["kind"] == "signal", error
        assert "killed by SIGKILL" in error["message"].splitlines()[0], error["message"]
        assert_nothing_left(slurm)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def node_agent_pid(slurm, node: int) -> int:
    """The agent on ``node``: of the processes running slurm.node_agent there (the agent and the
    ranks it forked, which share its command line), the one whose parent is none of them."""
    pids = {pid for pid in slurm.pids(node)
            if b"notebook_launch.engines.slurm.node_agent" in _read(f"/proc/{pid}/cmdline")}
    agents = [pid for pid in pids if int(_read(f"/proc/{pid}/stat").rsplit(b")", 1)[1].split()[1]) not in pids]
    assert len(agents) == 1 and len(pids) == 3, (agents, pids)
    return agents[0]


def _read(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError:   # ended meanwhile
        return b""
