"""start_ranks(n, cluster=SlurmCluster(...)): persistent ranks on a held allocation of the real
two-node SLURM (see conftest.py); the notebook is a Python process on node0 (the login node),
the ranks srun steps on both nodes that serve calls until closed.

After every scenario nothing of the pool may stay: no job in the queue, no rank process on
either node, no srun (``assert_nothing_left``).
"""
from __future__ import annotations

import json
import re
import signal

import pytest
from test_slurm_launch import (SETUP, assert_nothing_left, ctrl_c_while_pending_cancels_only_its_job, login_node_kernel,
                               sigkill_kernel_leaves_nothing, wait_for_lines)

pytestmark = pytest.mark.timeout(600)


def notebook_lines(slurm, code: str, timeout: float = 480) -> tuple[list, str]:
    """Run the notebook's code to its end; each of its ``OUT {json}`` lines, and all it printed."""
    proc = slurm.notebook(SETUP + code)
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"notebook failed ({proc.returncode}):\n{out}\n{err}"
    return [json.loads(line[4:]) for line in out.splitlines() if line.startswith("OUT ")], out + err


def test_state_lives_across_calls_on_four_ranks_over_two_nodes(slurm):
    """A process group and a model made in one call are used by the next, on the same processes
    of one job; push/pull; results in rank order; a rank's error shows its traceback and leaves
    every rank alive with its state; a timed-out call is interrupted and the ranks keep their
    state; close() ends the job and every rank process."""
    said, printed = notebook_lines(slurm, """
import subprocess
from notebook_launch import start_ranks
ranks = start_ranks(4, cluster=SlurmCluster(nodes=2, time="30"), ui="text")
def setup():
    global model, calls
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    calls = 1
    print(f"set up on {socket.gethostname()}", flush=True)
    return [os.getpid(), socket.gethostname()]
print("OUT", json.dumps({"first": ranks.run(setup), "nodes": ranks.nodes, "job": ranks.job_id,
                         "queue": subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True,
                                                 text=True).stdout.split()}), flush=True)
def step(scale):
    global calls
    import torch, torch.distributed as dist
    calls += 1
    total = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(total)                      # the group made by the first call
    model(torch.ones(2, 4)).sum().backward()
    return {"pid": os.getpid(), "rank": int(os.environ["RANK"]), "sum": total.item() * scale, "calls": calls,
            "weight": model.weight.detach().tolist()}
print("OUT", json.dumps(ranks.run(step, args=(10,))), flush=True)
import torch
ranks.push(offset=torch.arange(3.0))
def use():
    global calls
    calls += 1
    return (offset * int(os.environ["RANK"])).tolist()
print("OUT", json.dumps([ranks.run(use), ranks.pull("calls")]), flush=True)
def fails():
    if os.environ["RANK"] == "2":
        raise ValueError("bad batch on rank two")
    return "ok"
try:
    ranks.run(fails)
except LaunchError as err:
    print("OUT", error_json(err), flush=True)
def hangs():
    time.sleep(600)
try:
    ranks.run(hangs, timeout=3)
except LaunchError as err:
    print("OUT", error_json(err), flush=True)
def count():
    return [calls, os.getpid()]
print("OUT", json.dumps([ranks.run(count), ranks.alive, ranks.restarts]), flush=True)
print("OUT", json.dumps(ranks.stacks().verdict), flush=True)
ranks.close()
print("OUT", json.dumps(ranks.closed), flush=True)
""")
    first, second, pushed, failed, timed_out, after, where, closed = said
    pids = [pid for pid, _ in first["first"]]
    assert [host for _, host in first["first"]] == ["node0", "node0", "node1", "node1"]   # results in rank order
    assert first["nodes"] == ["node 0 (node0)", "node 0 (node0)", "node 1 (node1)", "node 1 (node1)"]
    assert first["queue"] == [first["job"]]                       # one job holds the ranks
    assert "slurm, persistent" in printed
    assert re.search(rf"SLURM job {first['job']} holds the ranks: rank 0 on node 0 \(node0\), .*rank 3 on node 1 "
                     r"\(node1\)", printed), printed
    assert "[node 1 rank 3] set up on node1" in printed             # output tagged with node and rank

    assert [r["rank"] for r in second] == [0, 1, 2, 3]
    assert [r["pid"] for r in second] == pids                       # the same processes, warm
    assert all(r["sum"] == 60.0 and r["calls"] == 2 for r in second)
    assert all(r["weight"] == second[0]["weight"] for r in second)
    assert pushed == [[[0.0, r * 1.0, r * 2.0] for r in range(4)], [3, 3, 3, 3]]

    assert failed["rank"] == 2 and failed["kind"] == "exception", failed
    assert failed["message"].splitlines()[0] == "node 1 (node1), rank 2 failed: ValueError: bad batch on rank two", \
        failed["message"]
    assert "Traceback from rank 2:" in failed["message"]
    assert re.search(r"line \d+, in fails\n", failed["message"]), failed["message"]
    assert "still running, with their state" in failed["message"]

    assert timed_out["kind"] == "timeout", timed_out
    assert "timed out after 3 s" in timed_out["message"]
    assert "still running, with their state" in timed_out["message"]

    assert after == [[[3, pid] for pid in pids], True, 0]            # state kept, no restart
    assert where == "no call is running: every rank waits for the next one"   # asked over their connections
    assert closed is True
    assert_nothing_left(slurm)                                      # close(): squeue empty, no rank left


def test_interrupt_a_hang_verdict_and_lost_ranks_restart_on_a_new_allocation(slurm):
    """Ctrl-C during a call interrupts the ranks, which keep their state; a timed-out call whose
    rank 1 never joins the others' all_reduce names where each rank is, and the ranks stuck in
    gloo are stopped (the next call starts fresh ranks on a new allocation, saying so); the job
    cancelled between calls (scancel: the scheduler's record says so) makes the next call a
    LaunchError naming the ranks and their nodes, and the call after it runs on fresh ranks."""
    proc = slurm.notebook(SETUP + """
import subprocess
from notebook_launch import start_ranks
ranks = start_ranks(2, cluster=SlurmCluster(nodes=2), ui="text")
def keep():
    global kept
    kept = int(os.environ["RANK"]) * 7
    print("running", flush=True)
    time.sleep(600)
try:
    ranks.run(keep)
except KeyboardInterrupt as exc:
    print("OUT", json.dumps({"interrupted": str(exc)}), flush=True)
print("OUT", json.dumps([ranks.run(lambda: kept), ranks.restarts, ranks.job_id]), flush=True)
def hang():
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        time.sleep(600)
    dist.all_reduce(torch.ones(4))
try:
    ranks.run(hang, timeout=20)
except LaunchError as err:
    print("OUT", error_json(err), flush=True)
def fresh():
    return [os.environ["RANK"], "kept" in globals()]
print("OUT", json.dumps([ranks.run(fresh), ranks.restarts, ranks.job_id]), flush=True)
subprocess.run(["scancel", ranks.job_id], check=True)
deadline = time.monotonic() + 120
while ranks.alive and time.monotonic() < deadline:   # the steps end as SLURM ends the job
    time.sleep(0.1)
try:
    ranks.run(fresh)
except LaunchError as err:
    print("OUT", error_json(err), flush=True)
print("OUT", json.dumps([ranks.run(fresh), ranks.restarts]), flush=True)
ranks.close()
""")
    try:
        wait_for_lines(proc, "] running", 2)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=480)
        assert proc.returncode == 0, f"notebook failed ({proc.returncode}):\n{out}\n{err}"
        said = [json.loads(line[4:]) for line in out.splitlines() if line.startswith("OUT ")]
        interrupted, kept, hung, fresh, lost, restarted = said
        assert "interrupted" in interrupted
        assert kept[:2] == [[0, 7], 0]                               # alive, with their state
        assert hung["kind"] == "timeout", hung
        first = hung["message"].splitlines()[0]
        assert re.search(r"rank 0 waits in all_reduce #1 \(notebook-\w+\.py:\d+\); rank 1 never reached it: "
                         r"it is in hang\(\) at notebook-\w+\.py:\d+ \(time\.sleep\(600\)\)", first), hung["message"]
        assert "was not asked" not in hung["message"]
        assert "next call starts fresh ranks" in hung["message"]      # stuck in gloo: stopped
        assert fresh[:2] == [[["0", False], ["1", False]], 1]
        assert fresh[2] != kept[2]                                   # a new allocation
        assert "the ranks were restarted because" in out
        assert lost["type"] == "LaunchError", lost
        assert re.match(r"notebook_launch: ranks 0, 1 \(node 0 \(node0\) and node 1 \(node1\)\) were lost between "
                        r"calls: SLURM cancelled the job", lost["message"]), lost["message"]
        assert "This call did not run" in lost["message"]
        assert restarted == [[["0", False], ["1", False]], 2]
        assert_nothing_left(slurm)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_killed_notebook_with_ranks_held_leaves_no_job_and_no_rank(slurm):
    """The notebook (a Python process) SIGKILLed between calls (no cleanup of ours runs): the
    watchdog cancels the held job and the ranks end with their connections."""
    proc = slurm.notebook(SETUP + """
from notebook_launch import start_ranks
ranks = start_ranks(4, cluster=SlurmCluster(nodes=2), ui="none")
def keep():
    global kept
    kept = [0] * 1000
    return os.getpid()
assert len(set(ranks.run(keep))) == 4
print("ready", flush=True)
time.sleep(600)
""")
    try:
        wait_for_lines(proc, "ready")
        assert len(slurm.jobs()) == 1
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert_nothing_left(slurm)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_sigkilled_kernel_with_ranks_held_leaves_no_job_and_no_rank(slurm):
    """The same in a real Jupyter kernel on the login node: its process SIGKILLed while its ranks
    wait between calls; squeue is empty and no rank process is left."""
    pytest.importorskip("jupyter_client")
    with login_node_kernel(slurm) as (km, kc):
        reply = kc.execute_interactive("""
from notebook_launch import start_ranks, SlurmCluster
ranks = start_ranks(4, cluster=SlurmCluster(nodes=2), ui="text")
def keep():
    global kept
    kept = [0] * 1000
    return len(kept)
assert ranks.run(keep) == [1000] * 4
""", timeout=300)
        assert reply["content"]["status"] == "ok", reply["content"]
        assert len(slurm.jobs()) == 1
        sigkill_kernel_leaves_nothing(slurm, km)


def test_start_ranks_says_the_job_is_pending_and_ctrl_c_cancels_it(slurm):
    """start_ranks while another job holds every node: the cell says the allocation waits (before
    any call's panel), and Ctrl-C cancels the queued job; the other job is left alone."""
    ctrl_c_while_pending_cancels_only_its_job(slurm, """
from notebook_launch import start_ranks
start_ranks(4, cluster=SlurmCluster(nodes=2), ui="text")
""", says="pending (Resources); Stop or Ctrl-C cancels it")
