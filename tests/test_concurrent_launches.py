"""Launches started at the same instant on one machine never collide on a port: from one
notebook's threads and from several notebooks (processes). Each launch claims its port until
its run ends (net.PortReservation), so the second finds the default port taken and picks another,
where before one of them failed with EADDRINUSE in rank 0's TCPStore."""
from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from notebook_launch import notebook_launcher
from notebook_launch.errors import LaunchArgumentError
from notebook_launch.planning.net import PortReservation, claim_free_port

pytestmark = pytest.mark.timeout(240)


def _barrier_rank(meet_dir: str | None = None, launches: int = 0):
    """Join the process group; with ``meet_dir``, rank 0 then waits until ``launches`` launches
    hold their process groups at once, so the launches overlap whatever the scheduling."""
    import time

    import torch.distributed as dist
    dist.init_process_group("gloo")
    if meet_dir and dist.get_rank() == 0:
        open(os.path.join(meet_dir, str(os.getpid())), "w").close()
        deadline = time.monotonic() + 90
        while len(os.listdir(meet_dir)) < launches:
            if time.monotonic() > deadline:   # the launches did not overlap: the test would prove nothing
                raise TimeoutError(f"only {len(os.listdir(meet_dir))} of {launches} launches met")
            time.sleep(0.05)
    dist.barrier()
    port = os.environ["MASTER_PORT"]
    dist.destroy_process_group()
    return port


def _meeting_place(tmp_path) -> str:
    """A folder of its own: tmp_path also holds the runs' log folder (conftest), which counted as
    a launch, so two of the three launches met and the third could start after one ended."""
    meet = tmp_path / "meet"
    meet.mkdir()
    return str(meet)


def test_threads_of_one_notebook_launch_at_once(tmp_path):
    meet = _meeting_place(tmp_path)
    results: dict[int, object] = {}
    start = threading.Barrier(3)

    def launch(i: int) -> None:
        start.wait()
        try:
            results[i] = notebook_launcher(_barrier_rank, args=(meet, 3), num_processes=2, timeout=120,
                                           ui="none")
        except Exception as exc:  # the assertion below shows it
            results[i] = exc

    threads = [threading.Thread(target=launch, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(isinstance(r, list) for r in results.values()), results
    ports = [r[0] for r in results.values()]   # type: ignore[index]
    assert len(set(ports)) == 3, ports


NOTEBOOK = """
import sys
from notebook_launch import notebook_launcher
sys.path.insert(0, sys.argv[1])
from test_concurrent_launches import _barrier_rank
sys.stdin.readline()   # every process is ready: go together
print("PORTS", notebook_launcher(_barrier_rank, args=(sys.argv[2], 3), num_processes=2, timeout=120, ui="none"))
"""


def test_several_notebooks_launch_at_once(tmp_path):
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    meet = _meeting_place(tmp_path)
    procs = [subprocess.Popen([sys.executable, "-c", NOTEBOOK, tests_dir, meet], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    for p in procs:   # all imported and waiting: release them together
        assert p.stdin is not None
        p.stdin.write("\n")
        p.stdin.flush()
    outs = [p.communicate(timeout=200) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outs]
    ports = {line.split(" ", 1)[1] for out, _ in outs for line in out.splitlines() if line.startswith("PORTS")}
    assert len(ports) == 3, outs


def test_a_claimed_port_is_busy_for_an_explicit_use_port_and_free_after_release():
    claim = claim_free_port(29731)
    assert claim is not None
    try:
        assert claim_free_port(29731) is None   # another launch of this machine holds it
        with pytest.raises(LaunchArgumentError, match="use_port=29731 is already in use"):
            notebook_launcher(print, num_processes=1, use_port=29731, ui="none")
    finally:
        claim.release()
    again = claim_free_port(29731)
    assert again is not None
    again.release()


def test_the_claim_ends_with_the_run_and_with_a_crashed_holder():
    """After a launch its port is free for the next; a holder that dies frees it (the kernel drops flock)."""
    notebook_launcher(_barrier_rank, num_processes=1, use_port=29733, ui="none", timeout=60)
    notebook_launcher(_barrier_rank, num_processes=1, use_port=29733, ui="none", timeout=60)
    holder = subprocess.Popen([sys.executable, "-c",
                               "import sys; from notebook_launch.planning.net import claim_free_port; "
                               "c = claim_free_port(29735); print(c is not None, flush=True); sys.stdin.read()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None
    assert holder.stdout.readline().strip() == "True"
    assert claim_free_port(29735) is None
    holder.kill()
    holder.wait()
    claim = claim_free_port(29735)
    assert isinstance(claim, PortReservation)
    claim.release()
