"""What the notebook reads from SLURM's own words, on its texts (tests/slurmcluster has the real
cluster: test_a_rank_over_the_jobs_memory_is_named_out_of_memory produces the first form there)."""
from __future__ import annotations

import pytest

from notebook_launch.engines.slurm.scheduler import step_memory_cause


@pytest.mark.parametrize("said, amounts", [
    # jobacct_gather's OverMemoryKill (the test cluster's: it has no cgroups)
    ("slurmstepd-node0: error: StepId=2.1 exceeded memory limit (580710400 > 314572800), being killed\n"
     "srun: error: node0: task 0: Killed\n", ": 554 MiB, over its 300 MiB limit"),
    # the cgroup's OOM killer (task/cgroup with ConstrainRAMSpace, 21.08 and later; the text of
    # slurmstepd's task_cgroup_memory: no cgroups here to make it say it)
    ("slurmstepd: error: Detected 1 oom_kill event in StepId=12.0. Some of the step tasks have been OOM Killed.\n"
     "srun: error: node3: task 0: Out Of Memory\n", ""),
    # the same before 21.08
    ("slurmstepd: error: Detected 1 oom-kill event(s) in step 12.0 cgroup. Some of your processes may have "
     "been killed by the cgroup out-of-memory handler.\n", ""),
], ids=["over-memory-kill", "cgroup", "cgroup-before-21.08"])
def test_a_step_killed_for_its_memory_is_named(said, amounts):
    assert step_memory_cause(said) == (
        f"SLURM killed the rank's step for using more memory than the job asked for (out of memory{amounts}; "
        f"ask for more with extra_options=['--mem=...'])")


@pytest.mark.parametrize("said", ["", "srun: error: node0: task 0: Killed\n",
                                  "srun: error: Node failure on node1\n"])
def test_other_ends_are_not_taken_for_memory(said):
    assert step_memory_cause(said) is None
