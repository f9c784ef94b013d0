"""notebook_launcher(..., cluster=SlurmCluster(...)) on a real two-node SLURM (see conftest.py): the
notebook is a Python process on node0 (the login node), ranks are srun steps on both nodes.

After every scenario nothing of the run may stay: no job in the queue, no rank process on either
node, no srun.
"""
from __future__ import annotations

import json
import os
import queue
import re
import selectors
import signal
import subprocess
import time
from contextlib import contextmanager
from typing import Any, Iterator

import pytest

pytestmark = pytest.mark.timeout(300)

SETUP = """
import json, os, socket, sys, time
from notebook_launch import notebook_launcher, SlurmCluster, LaunchError
def error_json(err):
    return json.dumps({"type": type(err).__name__, "message": str(err), "rank": getattr(err, "rank", None),
                       "kind": getattr(err, "kind", None), "log_dir": getattr(err, "log_dir", None)})
"""
# a node's agent and the ranks it forked (their command line is the agent's), and a rank's own step
# Four ranks over two nodes that say "running" and sleep; the launch's LaunchError printed as JSON
# (what a test that ends the run from outside reads: a preemption, a node failure, a killed agent).
SLEEPERS_REPORTING = """
def train():
    import time
    print("running", flush=True)
    time.sleep(600)
try:
    notebook_launcher(train, num_processes=4, cluster=SlurmCluster(nodes=2), ui="text")
except LaunchError as err:
    print(error_json(err))
"""
RANK_PROCESSES = ("notebook_launch.engines.slurm.node_agent", "notebook_launch.engines.slurm.task")
GONE_WITHIN = 60.0   # seconds SLURM may take to end a job's processes on a loaded machine


def run_notebook(slurm, code: str, timeout: float = 240) -> tuple[dict, str]:
    """Run the notebook's code to its end; its last stdout line is one JSON document."""
    proc = slurm.notebook(SETUP + code)
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"notebook failed ({proc.returncode}):\n{out}\n{err}"
    return json.loads(out.strip().splitlines()[-1]), out + err


def launch_error(slurm, code: str) -> tuple[dict, str]:
    wrapped = ("try:\n" + "\n".join("    " + line for line in code.strip().splitlines())
               + "\nexcept LaunchError as err:\n    print(error_json(err))\n"
               "else:\n    print(json.dumps({'type': None}))")
    result, printed = run_notebook(slurm, wrapped)
    assert result["type"] == "LaunchError", (result, printed)
    return result, printed


def wait_for_lines(proc: subprocess.Popen, needle: str, count: int = 1, timeout: float = 300) -> str:
    """Read the notebook's stdout until ``count`` lines contain ``needle``; what was read. It reads
    the fd itself, unbuffered: a line the file object had read ahead into its buffer would never
    wake the selector again. The notebook is killed if the lines do not come, so its stderr can be
    shown."""
    assert proc.stdout is not None and proc.stderr is not None
    text, selector = "", selectors.DefaultSelector()
    selector.register(proc.stdout.fileno(), selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    try:
        while (seen := sum(needle in line for line in text.splitlines())) < count:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise AssertionError(f"saw {seen} of {count} lines with {needle!r}:\n{text}\n"
                                     f"{proc.communicate()[1]}")
            if selector.select(0.5):
                text += os.read(proc.stdout.fileno(), 65536).decode(errors="replace")
    finally:
        selector.close()
    return text


def ctrl_c_while_pending_cancels_only_its_job(slurm, cell: str, says: str) -> None:
    """With another job holding every node, run ``cell`` in a notebook until it ``says`` its
    allocation waits, then Ctrl-C: KeyboardInterrupt, and the queued job is cancelled while the
    other job is left alone."""
    blocker = hold_every_node(slurm)
    proc = slurm.notebook(SETUP + cell)
    try:
        wait_for_lines(proc, says)
        assert len(slurm.jobs()) == 2
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:   # say where it hangs: its stacks (faulthandler) and what it printed
            proc.send_signal(signal.SIGABRT)
            out, err = proc.communicate(timeout=30)
            raise AssertionError(f"the notebook did not end within 120 s of Ctrl-C:\n{out}\n{err}") from None
        assert "KeyboardInterrupt" in err, err
        only_the_blocker_was_left(slurm, blocker)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def assert_nothing_left(slurm) -> None:
    """No job in the queue, no rank process (nor node agent) and no srun on either node."""
    deadline = time.monotonic() + GONE_WITHIN
    while (slurm.jobs() or rank_processes(slurm) or slurm.processes_with("srun ")) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert slurm.jobs() == []
    assert rank_processes(slurm) == []
    assert slurm.processes_with("srun ") == []


@contextmanager
def login_node_kernel(slurm: Any) -> Iterator[tuple[Any, Any]]:
    """A Jupyter kernel on node0 (the login node) and its client, ready; shut down after, its
    channels' leftover messages drained."""
    km = slurm.kernel_manager()
    km.start_kernel(env=slurm.env, cwd=str(slurm.tmp))
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=120)
        yield km, kc
    finally:
        try:
            while True:
                kc.get_iopub_msg(timeout=0.1)
        except queue.Empty:
            pass
        kc.stop_channels()
        if km.has_kernel:
            km.shutdown_kernel(now=True)


def sigkill_kernel_leaves_nothing(slurm: Any, km: Any) -> None:
    """SIGKILL the kernel (no cleanup of ours runs): the watchdog cancels its job and the ranks end
    with their connections; squeue is empty and no rank process is left."""
    km.provisioner.process.kill()   # `ip netns exec` execs the kernel: this is its process
    km.provisioner.process.wait()
    assert_nothing_left(slurm)


def rank_processes(slurm) -> list[str]:
    return [found for needle in RANK_PROCESSES for found in slurm.processes_with(needle)]


def test_four_ranks_on_two_nodes_all_reduce_and_results(slurm):
    result, printed = run_notebook(slurm, """
import torch, torch.distributed as dist
def train(scale):
    dist.init_process_group("gloo")
    total = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(total)
    print("rank", dist.get_rank(), "on", socket.gethostname())
    dist.destroy_process_group()
    return {"rank": int(os.environ["RANK"]), "local_rank": int(os.environ["LOCAL_RANK"]),
            "host": socket.gethostname(), "sum": total.item() * scale, "python": sys.executable,
            "backend": "gloo", "world": int(os.environ["WORLD_SIZE"]),
            "precision": os.environ["ACCELERATE_MIXED_PRECISION"], "accelerate_cpu": os.environ["ACCELERATE_USE_CPU"]}
results = notebook_launcher(train, args=(10,), num_processes=4, cluster=SlurmCluster(nodes=2, time="30"),
                            ui="text", mixed_precision="bf16")
print(json.dumps(results))
""")
    assert [r["rank"] for r in result] == [0, 1, 2, 3]
    assert [r["local_rank"] for r in result] == [0, 1, 0, 1]
    assert [r["host"] for r in result] == ["node0", "node0", "node1", "node1"]
    assert {r["sum"] for r in result} == {60.0}
    assert {r["world"] for r in result} == {4}
    assert {(r["precision"], r["accelerate_cpu"]) for r in result} == {("bf16", "true")}   # Accelerate's variables
    assert re.search(r"SLURM job \d+ runs on node\[0-1\], time limit 00:30:00", printed), printed
    assert "[node 1 rank 3] rank 3 on node1" in printed            # output tagged with node and rank
    assert "rank 2 [cpu on node 1 (node1)] done" in printed        # the panel's rows name the node
    log_dir = printed.split("logs: ", 1)[1].split()[0]
    assert "rank 2 on node1" in open(os.path.join(log_dir, "rank2.log")).read()
    assert_nothing_left(slurm)


def test_a_failing_rank_stops_the_rest_and_the_job_ends(slurm):
    error, printed = launch_error(slurm, """
def train():
    import os, time
    if os.environ["RANK"] == "2":
        time.sleep(1)
        raise ValueError("rank two gives up")
    time.sleep(600)
notebook_launcher(train, num_processes=4, cluster=SlurmCluster(nodes=2), ui="text")
""")
    assert error["rank"] == 2
    assert "ValueError: rank two gives up" in error["message"]
    assert "raise ValueError" in error["message"]   # the failing rank's traceback, with its line
    assert_nothing_left(slurm)


def test_the_interpreter_missing_on_the_nodes_is_said(slurm):
    error, _ = launch_error(slurm, """
notebook_launcher(print, num_processes=2, cluster=SlurmCluster(nodes=2, python="/nonexistent/bin/python3"), ui="none")
""")
    assert "/nonexistent/bin/python3) is not on that node at the same path" in error["message"]
    assert_nothing_left(slurm)


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGKILL], ids=["interrupt", "notebook-killed"])
def test_an_interrupt_or_a_killed_notebook_ends_the_job(slurm, how):
    """Ctrl-C (SIGINT to the notebook) stops the run and cancels the job; a notebook SIGKILLed
    runs no cleanup, so its watchdog cancels the job and the ranks end with their connections."""
    proc = slurm.notebook(SETUP + """
def train():
    import time
    print("running", flush=True)
    time.sleep(600)
notebook_launcher(train, num_processes=4, cluster=SlurmCluster(nodes=2), ui="text")
""")
    try:
        wait_for_lines(proc, "] running", 4)
        assert len(slurm.jobs()) == 1
        proc.send_signal(how)
        _, err = proc.communicate(timeout=120)
        if how == signal.SIGINT:
            assert "KeyboardInterrupt" in err, err
        assert_nothing_left(slurm)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def hold_every_node(slurm) -> str:
    """Another job that holds every CPU of both nodes; its id."""
    said = slurm.run(0, "salloc", "--no-shell", "--nodes=2", "--ntasks-per-node=2", "--job-name=blocker").stderr
    return said.split("job allocation")[1].split()[0]


def only_the_blocker_was_left(slurm, blocker: str) -> None:
    """Our job left the queue while the other (``hold_every_node``) runs on; then it is cancelled too
    and nothing of either may stay."""
    assert [line.split()[0] for line in slurm.jobs()] == [blocker]
    slurm.run(0, "scancel", blocker)
    assert_nothing_left(slurm)


def test_a_pending_job_says_why_and_starts_when_the_nodes_are_freed(slurm):
    blocker = hold_every_node(slurm)
    proc = slurm.notebook(SETUP + """
def train():
    return int(os.environ["RANK"])
print(json.dumps(notebook_launcher(train, num_processes=4, cluster=SlurmCluster(nodes=2), ui="text")))
""")
    try:
        shown = wait_for_lines(proc, "pending (Resources); Stop or Ctrl-C cancels it", 1)
        assert "SLURM job" in shown
        slurm.run(0, "scancel", blocker)
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err
        assert json.loads(out.strip().splitlines()[-1]) == [0, 1, 2, 3]
        assert_nothing_left(slurm)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_an_interrupt_while_pending_cancels_the_queued_job(slurm):
    ctrl_c_while_pending_cancels_only_its_job(slurm, """
notebook_launcher(print, num_processes=4, cluster=SlurmCluster(nodes=2), ui="text")
""", says="pending (Resources)")


def test_the_time_limit_is_named_as_the_cause(slurm):
    """SLURM ends the job at its 1-minute limit (the slowest test here: 60 to 90 s, as slurmctld checks
    time limits every 30 s, a constant no setting changes); the error says so, from the scheduler's
    record, not "killed by SIGTERM"."""
    error, _ = launch_error(slurm, """
def train():
    import time
    time.sleep(600)
notebook_launcher(train, num_processes=2, cluster=SlurmCluster(nodes=2, time="1"), ui="none")
""")
    assert "SLURM ended the job at its 00:01:00 time limit" in error["message"], error
    assert_nothing_left(slurm)


def test_a_rank_over_the_jobs_memory_is_named_out_of_memory(slurm):
    """SLURM kills rank 1's step for using more than the job's --mem=300M (the fixture's OverMemoryKill;
    on a cluster with cgroups their OOM killer does it, said in srun's output too): the error says so,
    with the amounts, rather than "killed by SIGKILL". The job itself runs on (its record never says
    OUT_OF_MEMORY) until the run ends it."""
    error, _ = launch_error(slurm, """
def train():
    import os, time
    if os.environ["RANK"] == "1":
        block = bytearray(600 * 2**20)
        for i in range(0, len(block), 4096):
            block[i] = 1
    time.sleep(600)
notebook_launcher(train, num_processes=2, cluster=SlurmCluster(nodes=1, extra_options=["--mem=300M"]), ui="none")
""")
    assert error["rank"] == 1, error
    assert "SLURM killed the rank's step for using more memory than the job asked for (out of memory: " \
           in error["message"], error
    assert "MiB, over its 300 MiB limit; ask for more with extra_options=['--mem=...'])" in error["message"], error
    assert_nothing_left(slurm)


def test_a_preempted_job_is_named_from_the_scheduler(slurm):
    """A job in the fixture's higher-priority partition ("urgent") takes both nodes: SLURM cancels ours
    (PreemptMode=CANCEL), and the error says the job was preempted, from the job's record."""
    proc = slurm.notebook(SETUP + SLEEPERS_REPORTING)
    try:
        wait_for_lines(proc, "] running", 4)
        slurm.run(0, "salloc", "--no-shell", "--partition=urgent", "--nodes=2", "--ntasks-per-node=2",
                  "--job-name=urgent")
        out, err = proc.communicate(timeout=180)
        error = json.loads(out.strip().splitlines()[-1])
        assert error["type"] == "LaunchError", (out, err)
        assert "SLURM preempted the job (a job of higher priority took its nodes)" in error["message"], error
        slurm.cancel_all()
        assert_nothing_left(slurm)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_node_failure_is_named_from_the_scheduler(slurm):
    """node1 dies (every process in it SIGKILLed: slurmd, slurmstepd, ranks); once slurmctld marks it
    down (SlurmdTimeout, 10 s here, and its pings' MessageTimeout, 5 s) the job ends NODE_FAIL, and the
    error says a node failed rather than "exited with code 0" (what srun's exit code alone says)."""
    proc = slurm.notebook(SETUP + SLEEPERS_REPORTING)
    try:
        wait_for_lines(proc, "] running", 4)
        slurm.kill_node(1)
        out, err = proc.communicate(timeout=180)
        error = json.loads(out.strip().splitlines()[-1])
        assert error["type"] == "LaunchError", (out, err)
        assert error["rank"] in (2, 3), error
        assert "a node failed (NODE_FAIL" in error["message"] or "Node failure on node1" in error["message"], error
        assert_nothing_left(slurm)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_timeout_names_the_odd_rank_across_nodes_and_ends_the_job(slurm):
    """Rank 3 (on node1) sleeps instead of joining the all_reduce the others wait in: the timeout's
    first line says so, with the lines, though no rank runs on the notebook's machine's processes;
    every rank is stopped and the job ends."""
    error, _ = launch_error(slurm, """
import torch, torch.distributed as dist
def train():
    dist.init_process_group("gloo")
    if dist.get_rank() == 3:
        time.sleep(600)
    dist.all_reduce(torch.ones(4))
notebook_launcher(train, num_processes=4, cluster=SlurmCluster(nodes=2), ui="none", timeout=20)
""")
    assert error["kind"] == "timeout", error
    first = error["message"].splitlines()[0]
    assert re.search(r"ranks 0, 1, 2 wait in all_reduce #1 \(notebook-\w+\.py:\d+\); rank 3 never reached it: "
                     r"it is in train\(\) at notebook-\w+\.py:\d+ \(time\.sleep\(600\)\)", first), error["message"]
    assert "was not asked" not in error["message"]
    assert_nothing_left(slurm)


def test_a_job_that_misses_its_deadline_in_the_queue_is_named_from_the_scheduler(slurm):
    """Another job holds both nodes; ours (extra_options --deadline, 65 s away, with a 1-minute time
    limit) waits "pending (Resources)" until it can no longer end before its deadline, and SLURM
    ends it (DEADLINE). salloc only says "Job has been cancelled": the error names the deadline from
    the job's record. (A running job never ends DEADLINE: SLURM shortens its limit to fit the
    deadline, and it ends TIMEOUT, tested above.)"""
    blocker = hold_every_node(slurm)
    proc = slurm.notebook(SETUP + """
try:
    notebook_launcher(print, num_processes=4, ui="text",
                      cluster=SlurmCluster(nodes=2, time="1", extra_options=["--deadline=now+65"]))
except LaunchError as err:
    print(error_json(err))
""")
    try:
        wait_for_lines(proc, "pending (Resources)", 1)
        out, err = proc.communicate(timeout=180)
        error = json.loads(out.strip().splitlines()[-1])
        assert error["type"] == "LaunchError", (out, err)
        assert "SLURM ended the job at its deadline (DEADLINE: it could no longer start" in error["message"], error
        only_the_blocker_was_left(slurm, blocker)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
