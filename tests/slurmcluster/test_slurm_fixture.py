"""The fixture's cluster itself: two nodes, each with its own hostname, reachable by srun."""
from __future__ import annotations

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
