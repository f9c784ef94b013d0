"""The harness of Monarch's SlurmJob beside our SlurmCluster (benchmarks/monarch_slurm.py): the
override that lets Monarch 0.7.0 read SLURM 22.05's ``squeue --json``, and (opt-in, it starts a
two-node SLURM) the command's rows filled on both sides. No timings are asserted."""
from __future__ import annotations

import copy
import os
import sys

import pytest

from helpers.benchmark_runs import ROOT, quick_module_rows

sys.path.insert(0, ROOT)

from benchmarks.monarch_slurm_probe import job_from_squeue_json  # noqa: E402


def allocated(name: str) -> dict:
    return {"sockets": {"0": {"cores": {"0": "allocated"}}}, "nodename": name, "cpus_used": 0,
            "memory_used": 0, "memory_allocated": 2000}


# The shape squeue 22.05.8 --json printed on the tests' two-node cluster (openapi v0.0.38), trimmed: it lists
# every job whatever --job says, an earlier one first.
LISTING_22_05 = {
    "meta": {"plugin": {"type": "openapi/v0.0.38"}, "Slurm": {"release": "22.05.8"}},
    "jobs": [
        {"job_id": 7, "job_state": "CANCELLED",
         "job_resources": {"nodes": "node0", "allocated_hosts": 1, "allocated_nodes": [allocated("node0")]}},
        {"job_id": 8, "job_state": "RUNNING",
         "job_resources": {"nodes": "node[0-1]", "allocated_hosts": 2,
                           "allocated_nodes": [allocated("node0"), allocated("node1")]}},
    ],
}


def test_the_job_asked_for_is_found_in_a_listing_of_every_job():
    job = job_from_squeue_json(copy.deepcopy(LISTING_22_05), "8")
    assert job is not None and job["job_state"] == "RUNNING"
    assert job_from_squeue_json(copy.deepcopy(LISTING_22_05), "9") is None   # gone from the queue


def test_slurm_22_05_nodes_read_in_the_layout_monarch_reads():
    job = job_from_squeue_json(copy.deepcopy(LISTING_22_05), "8")
    assert job is not None
    assert job["job_resources"]["nodes"] == {"allocation": [{"name": "node0"}, {"name": "node1"}]}


def test_a_listing_in_monarchs_layout_passes_unchanged():
    newer = {"jobs": [{"job_id": 3, "job_state": ["RUNNING"],
                       "job_resources": {"nodes": {"count": 2, "allocation": [{"name": "a"}, {"name": "b"}]}}}]}
    assert job_from_squeue_json(copy.deepcopy(newer), "3") == newer["jobs"][0]


@pytest.mark.skipif(not os.environ.get("NOTEBOOK_LAUNCH_BENCHMARK_SLURM"),
                    reason="starts a two-node SLURM and Monarch's SlurmJob beside ours (about a minute): "
                           "NOTEBOOK_LAUNCH_BENCHMARK_SLURM=1 runs it")
@pytest.mark.timeout(900)
def test_monarch_slurm_rows_are_measured_on_both_sides(tmp_path):
    rows = quick_module_rows("monarch_slurm", str(tmp_path / "RESULTS-anchors-slurm.md"), "15", timeout=800)
    assert len(rows) == 2, rows
    (start, call) = rows
    assert "n=1" in start[3] and "Monarch SlurmJob" in start[7] and "n=1" in start[7], start
    assert "n=20" in call[3] and "n=20" in call[7] and "ours/Monarch" in call[8], call
