"""The fixture's cluster itself: two nodes, each with its own hostname, reachable by srun."""
from __future__ import annotations

import sys
import time

import pytest

pytestmark = pytest.mark.timeout(300)


def test_srun_runs_on_both_nodes(slurm):
    out = slurm.run(0, "srun", "-N2", "-n2", "-l", "hostname").stdout.split()
    assert sorted(out) == ["0:", "1:", "node0", "node1"], out
    deadline = time.monotonic() + 60   # the step's job completes just after srun returns
    while slurm.jobs() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert slurm.jobs() == []


def test_env_reports_the_slurm_partitions(slurm):
    """``notebook-launch env`` on the login node names the partitions sinfo lists."""
    out = slurm.run(0, sys.executable, "-m", "notebook_launch", "env").stdout
    line = next(line for line in out.splitlines() if line.startswith("slurm:"))
    assert "partitions debug* (up, 2 nodes, 4 CPUs idle, 0 allocated)" in line, line
