"""A job SLURM could never start, and timeout= over the queue, on the real two-node SLURM (see
conftest.py). The variants of "can never start" (CPUs, memory, GPUs, partition states, time limits)
are tested on captured scontrol text (tests/test_slurm_feasibility.py); here the end-to-end path."""
from __future__ import annotations

import json
import re
import signal
import subprocess

import pytest
from test_slurm_launch import SETUP, assert_nothing_left, hold_every_node, wait_for_lines

pytestmark = pytest.mark.timeout(300)


def test_a_job_asking_for_more_nodes_than_exist_ends_before_it_is_queued(slurm):
    """nodes=3 on two nodes: SLURM would queue it "pending (PartitionNodeLimit)" forever; the launch
    and start_ranks end at once with what was asked and what the partition has, nothing submitted.
    A job that got into the queue anyway (the check came before a change, or cannot see the cause)
    ends as soon as its pending reason says it never starts."""
    proc = slurm.notebook(SETUP + """
from notebook_launch import start_ranks
from notebook_launch.errors import GuardError
from notebook_launch.engines.base import StartFailed, StartWatch
from notebook_launch.engines.slurm.allocation import Allocation
from pathlib import Path
said = {}
for name, start in [("launch", lambda: notebook_launcher(print, num_processes=3, cluster=SlurmCluster(nodes=3))),
                    ("persistent", lambda: start_ranks(3, cluster=SlurmCluster(nodes=3)))]:
    try:
        start()
    except GuardError as err:
        said[name] = str(err)
allocation = Allocation(SlurmCluster(nodes=3), "queued-anyway")
try:
    allocation.ask(StartWatch(), 1, Path.cwd())
except StartFailed as failed:
    said["queued"] = failed.text
finally:
    allocation.release()
print(json.dumps(said))
""")
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:   # it waited in the queue (the check missed the job): Ctrl-C cancels it
            stop(proc)
    assert proc.returncode == 0, err
    said = json.loads(out.strip().splitlines()[-1])
    expected = ("SLURM could never start this job: in partition debug, SlurmCluster(nodes=3) asks for 3 nodes; "
                "the partition has 2: ask for at most 2. Nothing was submitted.")
    assert said.get("launch") == expected, (said, out, err)
    assert said.get("persistent") == expected, said
    # SLURM says PartitionConfig or PartitionNodeLimit, depending on when it looked
    assert re.match(r"SLURM job \d+ can never start: it is pending \(Partition(Config|NodeLimit)\): it asks for more ",
                    said["queued"]), said
    assert ("; in partition debug, SlurmCluster(nodes=3) asks for 3 nodes; the partition has 2: ask for at most 2. "
            "The job was cancelled.") in said["queued"], said
    assert "pending" not in out.replace(said["queued"], "")   # the launch and start_ranks never queued
    assert_nothing_left(slurm)


def test_timeout_counts_the_wait_in_the_queue_and_says_which_part_ran_out(slurm):
    """Another job holds both nodes. timeout=3 runs out while ours is pending: the error says it was
    still pending in the queue and why (Resources), and the job is gone. A second launch waits until
    the test frees the nodes; its ranks then sleep past its timeout=40, which counts the wait in the
    queue: the error says how much of it went there."""
    blocker = hold_every_node(slurm)
    proc = slurm.notebook(SETUP + """
def sleep():
    time.sleep(600)
for timeout in (3, 40):
    try:
        notebook_launcher(sleep, num_processes=4, cluster=SlurmCluster(nodes=2), ui="text", timeout=timeout)
    except LaunchError as err:
        print(error_json(err), flush=True)
""")
    try:
        shown = wait_for_lines(proc, "pending (Resources); Stop or Ctrl-C cancels it", 2, timeout=120)
        error = json.loads(next(line for line in shown.splitlines() if line.startswith("{")))
        assert error["kind"] == "timeout", error
        assert ("notebook_launch: timeout=3 s ran out before the ranks started: SLURM job " in error["message"]
                and " was still pending in the queue after 3 s: reason Resources (the nodes it needs are busy with "
                "other jobs). No rank ran; the job was cancelled." in error["message"]), error
        assert len(slurm.jobs()) == 2   # the first launch's job is gone; the blocker and the second's wait
        slurm.run(0, "scancel", blocker)
        out, err = proc.communicate(timeout=180)
        error = json.loads(out.strip().splitlines()[-1])
        assert error["kind"] == "timeout", (error, err)
        first_line = error["message"].splitlines()[0]
        assert "timed out after 40 s (" in first_line and " s of it pending in SLURM's queue, the rest starting " \
            "and running the ranks): ranks 0, 1, 2, 3 are in sleep()" in first_line, error
        assert_nothing_left(slurm)
    finally:
        if proc.poll() is None:
            stop(proc)


def stop(proc) -> None:
    """Ctrl-C a notebook that is still waiting (its job is cancelled), then kill it if it does not end."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
