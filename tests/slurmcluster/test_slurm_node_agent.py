"""A node's ranks on SLURM are forked by one agent per node (``slurm.node_agent``), which imported
torch (and DDP's modules, for training code) once before the fork; code that never names torch
gets nothing heavy. The notebook learns each forked rank's true end from its agent: a signal, an
exit code, as a rank's own process would say it.
"""
from __future__ import annotations

import pytest
from test_slurm_launch import assert_nothing_left, launch_error, run_notebook

pytestmark = pytest.mark.timeout(300)


def test_a_nodes_ranks_are_forked_by_one_agent_that_imported_torch_once(slurm):
    result, _ = run_notebook(slurm, """
def train():
    before = sorted(m for m in ("torch", "torch.distributed", "torch.nn.parallel", "torch._dynamo") if m in sys.modules)
    parent = os.getppid()
    with open(f"/proc/{parent}/cmdline", "rb") as f:
        parent_command = f.read().replace(bytes(1), b" ").decode()
    import torch
    torch.nn.parallel.DistributedDataParallel   # training code: DDP's modules are imported before the fork
    return {"rank": int(os.environ["RANK"]), "host": socket.gethostname(), "pid": os.getpid(), "parent": parent,
            "parent_command": parent_command, "imported_before": before}
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
    assert all("-m notebook_launch.slurm.node_agent" in r["parent_command"] for r in ranks), ranks
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
