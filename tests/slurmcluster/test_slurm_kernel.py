"""A SLURM launch from a real Jupyter kernel on node0 (the login node): the widget panel's rows name
each rank's node, and its Stop button, clicked as a browser clicks it, cancels the job, whether it
runs or still waits in the queue; the kernel lives on and nothing is left on the cluster."""
from __future__ import annotations

import time
from typing import Any

import pytest
from test_slurm_launch import assert_nothing_left, hold_every_node, login_node_kernel, sigkill_kernel_leaves_nothing

jupyter_client = pytest.importorskip("jupyter_client")
pytest.importorskip("ipywidgets")
pytestmark = pytest.mark.timeout(400)

CELL = """
from notebook_launch import notebook_launcher, SlurmCluster
def train():
    import time
    print("running", flush=True)
    time.sleep(600)
notebook_launcher(train, num_processes=4, cluster=SlurmCluster(nodes=2))
"""


def run_and_stop(kc: Any, until: str) -> tuple[dict, str]:
    """Run CELL; once the panel's messages carry ``until``, click its Stop button; the cell's
    reply and everything the panel and the cell showed."""
    launch_id = kc.execute(CELL, stop_on_error=False)
    stop_comm, seen = None, ""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not (stop_comm and until in seen):
        msg = kc.get_iopub_msg(timeout=120)
        content = msg["content"]
        if msg["msg_type"] in ("comm_open", "comm_msg"):
            state = content["data"].get("state", {})
            if state.get("_model_name") == "ButtonModel" and state.get("description") == "Stop":
                stop_comm = content["comm_id"]
            seen += str(state)
        elif msg["msg_type"] == "stream":
            seen += content["text"]
    assert stop_comm and until in seen, f"no Stop button or no {until!r} within the wait:\n{seen[-3000:]}"
    kc.shell_channel.send(kc.session.msg("comm_msg", {"comm_id": stop_comm, "data": {
        "method": "custom", "content": {"event": "click"}}}))
    while True:
        reply = kc.get_shell_msg(timeout=120)
        if reply["msg_type"] == "execute_reply" and reply["parent_header"]["msg_id"] == launch_id:
            return reply["content"], seen


def test_the_panel_names_nodes_and_stop_cancels_a_running_or_pending_job(slurm):
    with login_node_kernel(slurm) as (km, kc):
        kc.execute_interactive("import ipywidgets", timeout=120)
        reply, seen = run_and_stop(kc, "on node 1 (node1)")     # a rank's row names its node
        assert (reply["status"], reply["ename"]) == ("error", "KeyboardInterrupt"), reply
        assert "Stop button" in reply["evalue"]
        assert_nothing_left(slurm)

        blocker = hold_every_node(slurm)
        reply, seen = run_and_stop(kc, "pending (Resources)")
        assert (reply["status"], reply["ename"]) == ("error", "KeyboardInterrupt"), reply
        assert [line.split()[0] for line in slurm.jobs()] == [blocker]   # the queued job was cancelled
        slurm.run(0, "scancel", blocker)
        assert_nothing_left(slurm)
        assert km.is_alive()


def test_a_sigkilled_kernel_leaves_no_job_and_no_rank(slurm):
    """The notebook's kernel SIGKILLed mid-run (no cleanup of ours runs): the watchdog cancels the
    job and the ranks end with their connections; squeue is empty and no rank process is left."""
    with login_node_kernel(slurm) as (km, kc):
        kc.execute(CELL.replace("SlurmCluster(nodes=2))", "SlurmCluster(nodes=2), ui='text')"))
        running, deadline = 0, time.monotonic() + 240
        while running < 4 and time.monotonic() < deadline:
            msg = kc.get_iopub_msg(timeout=120)
            if msg["msg_type"] == "stream":
                running += msg["content"]["text"].count("] running")
        assert running == 4, "the ranks did not all start"
        assert len(slurm.jobs()) == 1
        sigkill_kernel_leaves_nothing(slurm, km)
