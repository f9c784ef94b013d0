"""SLURM ranks report their own resources (issue 34 item 1): the notebook cannot read a rank's /proc
on its node (the process it holds is srun's), so each rank samples itself (``rank/reports/resources.py``,
started by ``slurm.task``) and sends RESOURCES events; the rows, the final picture and the rank
logs show them as a local rank's. A real two-node SLURM (conftest.py). Every wait is for a condition."""
from __future__ import annotations

import os
import re

import pytest
from test_slurm_launch import assert_nothing_left, run_notebook

pytestmark = pytest.mark.timeout(300)

MiB = 1 << 20
ALLOCATED = 200 * MiB
PEAK = re.compile(r"^\s*rank (\d)\b.*\[avg cpu \d+% · peak ([\d.]+) (MiB|GiB) own of ([\d.]+) (MiB|GiB) resident",
                  re.MULTILINE)


def test_slurm_ranks_on_both_nodes_show_their_own_memory_and_cpu(slurm):
    result, printed = run_notebook(slurm, f"""
from notebook_launch.rank.reports import resources
def train():
    reporter = resources.current()
    assert reporter is not None, "a SLURM rank samples itself"
    block = bytearray({ALLOCATED}); block[::4096] = b"\\1" * len(range(0, len(block), 4096))
    sent = reporter.sent
    deadline = time.monotonic() + 120
    while reporter.sent < sent + 2 and time.monotonic() < deadline:   # a whole sample with the block went out
        time.sleep(0.05)
    return {{"host": socket.gethostname(), "sent": reporter.sent - sent}}
results = notebook_launcher(train, num_processes=4, cluster=SlurmCluster(nodes=2, time="30"), ui="text")
print(json.dumps(results))
""")
    assert [r["host"] for r in result] == ["node0", "node0", "node1", "node1"]
    assert [r["sent"] >= 2 for r in result] == [True] * 4, result
    # the final picture: every rank, on either node, its average CPU and its peak own memory
    peaks = {int(rank): float(own) * (1024 if unit == "GiB" else 1) for rank, own, unit, _, _ in PEAK.findall(printed)}
    assert sorted(peaks) == [0, 1, 2, 3], printed[-3000:]
    assert all(peak >= ALLOCATED / MiB for peak in peaks.values()), peaks
    log_dir = printed.split("logs: ", 1)[1].split()[0]
    for rank in range(4):
        text = open(os.path.join(log_dir, f"rank{rank}.log")).read()
        assert "[notebook_launch] resources: " in text and "(USS)" in text and "(PSS)" in text, text
    assert_nothing_left(slurm)
