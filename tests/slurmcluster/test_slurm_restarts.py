"""max_restarts on a real two-node SLURM (see conftest.py): a failed attempt's ranks all end and the
next attempt's start as new steps in the same allocation (the job is queued once), with the
restart count torch elastic sets and a fresh rendezvous; a job the scheduler ended takes no
further attempt, and the error says so. After each, nothing of the run may stay."""
from __future__ import annotations

import json
import re

import pytest
from test_slurm_launch import SETUP, assert_nothing_left, launch_error, run_notebook, wait_for_lines

pytestmark = pytest.mark.timeout(300)


def test_a_rank_that_fails_once_is_restarted_in_the_same_job_and_returns(slurm):
    """Rank 2 fails on attempt 0 (after its process group met on attempt 0's store); every rank
    starts again as new steps of the same job, meets on a fresh port, and returns. The cell says
    "restart 1 of 2" as elastic's and Ray's restarts do."""
    result, printed = run_notebook(slurm, """
def train():
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    seen = [os.environ[name] for name in ("TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
                                          "MASTER_PORT", "SLURM_JOB_ID")]
    if os.environ["RANK"] == "2" and seen[0] == "0":
        raise ValueError("attempt 0 fails on port %s in job %s" % (seen[2], seen[3]))
    total = torch.ones(1)
    dist.all_reduce(total)
    dist.destroy_process_group()
    return seen + [total.item()]
results = notebook_launcher(train, num_processes=4, cluster=SlurmCluster(nodes=2, time="30"), max_restarts=2,
                            ui="text")
print(json.dumps(results))
""")
    failed = re.search(r"rank 2 failed \(ValueError: attempt 0 fails on port (\d+) in job (\d+)\); "
                       r"restarting every rank \(restart 1 of 2\)", printed)
    assert failed, printed
    first_port, job = failed.groups()
    assert {tuple(r[:2]) for r in result} == {("1", "2")}, result    # the restart count, as torch elastic's
    assert {r[3] for r in result} == {job}, result                     # the same allocation: no new job
    assert len(re.findall(r"SLURM job \d+ runs on", printed)) == 1, printed
    assert {r[2] for r in result} != {first_port}, result              # a fresh rendezvous port
    assert {r[4] for r in result} == {4.0}
    assert_nothing_left(slurm)


def test_a_rank_that_always_fails_uses_up_the_restarts(slurm):
    error, printed = launch_error(slurm, """
def train():
    if os.environ["RANK"] == "1":
        raise ValueError("rank one fails on attempt " + os.environ["TORCHELASTIC_RESTART_COUNT"])
    time.sleep(600)
notebook_launcher(train, num_processes=2, cluster=SlurmCluster(nodes=2), max_restarts=2, ui="text")
""")
    assert "restarting every rank (restart 1 of 2)" in printed, printed
    assert "rank 1 failed (ValueError: rank one fails on attempt 1); restarting every rank (restart 2 of 2)" \
        in printed, printed
    assert error["rank"] == 1, error
    assert "ValueError: rank one fails on attempt 2" in error["message"], error
    assert "Attempt 3 of 3: no restarts left (max_restarts=2)." in error["message"], error
    assert_nothing_left(slurm)


@pytest.mark.parametrize("ending, said", [
    ("preempted", r"SLURM preempted the job"),
    ("node-failed", r"SLURM ended the job because a node failed \(NODE_FAIL|SLURM reported a node failure "
                    r"\(Node failure on node1\)"),
])
def test_a_job_the_scheduler_ended_is_not_restarted_and_the_error_says_why(slurm, ending, said):
    """The scheduler ends the job itself (preempted by a job of the fixture's "urgent" partition, or
    node1 dies: srun says "Node failure on node1" before slurmctld marks it down and the job
    NODE_FAIL): no attempt can run in it again, so the run is not restarted though restarts are
    left, and the error says why and what to do."""
    proc = slurm.notebook(SETUP + """
def train():
    print("running", flush=True)
    time.sleep(600)
try:
    notebook_launcher(train, num_processes=4, cluster=SlurmCluster(nodes=2), max_restarts=2, ui="text")
except LaunchError as err:
    print(error_json(err))
""")
    try:
        wait_for_lines(proc, "] running", 4)
        if ending == "preempted":
            slurm.run(0, "salloc", "--no-shell", "--partition=urgent", "--nodes=2", "--ntasks-per-node=2",
                      "--job-name=urgent")
        else:
            slurm.kill_node(1)
        out, err = proc.communicate(timeout=180)
    finally:   # a notebook that did not end by itself is ended here, never left running
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    error = json.loads(out.strip().splitlines()[-1])
    assert error["type"] == "LaunchError", (out, err)
    assert "restarting every rank" not in out, out
    assert re.search(r"Not restarted: SLURM job \d+ ended \((" + said + ")", error["message"]), error
    assert "run the launch again to ask SLURM for a new one" in error["message"], error
    assert "Attempt 1 of 3: not restarted (max_restarts=2)." in error["message"], error
    slurm.cancel_all()
    assert_nothing_left(slurm)
