"""Whether a SLURM job can ever start, what a pending reason means, and whether a cancelled job's end
is worth waiting for: decided on what ``scontrol -o`` said on the test cluster (helpers.scontrol_text,
captured), without a cluster. tests/slurmcluster/test_slurm_never_starts.py runs the end-to-end path
on the real one."""
from __future__ import annotations

import pytest
from helpers.scontrol_text import COMPLETING_ON_A_SILENT_NODE, DOWN_NODE, NODES, PARTITIONS

from notebook_launch.engines.slurm.allocation import GONE_TIMEOUT, SAY_AFTER, end_wait, still_pending
from notebook_launch.engines.slurm.cluster import SlurmCluster
from notebook_launch.engines.slurm.feasibility import Request, never_starting_reason, never_starts
from notebook_launch.engines.slurm.records import (fields, gpus_of, megabytes_of, parse_nodes, parse_partitions,
                                                   seconds_of)

# The captured texts, changed where the test cluster cannot show a case (each change said):
# a partition of both nodes that allows one node per job (MaxNodes=1)
ONE_NODE_PER_JOB = PARTITIONS.splitlines()[0].replace("MaxNodes=UNLIMITED", "MaxNodes=1").replace(
    "PartitionName=debug", "PartitionName=capped").replace("Default=YES", "Default=NO")
# node0 with four A100s (the test machine has no GPU; the Gres= form is SLURM's)
GPU_NODES = NODES.replace("Gres=(null)", "Gres=gpu:a100:4(S:0-1)", 1)


def why(cluster: SlurmCluster, world_size: int, partitions: str = PARTITIONS, nodes: str = NODES) -> str | None:
    return never_starts(Request.of(cluster, world_size), parse_partitions(partitions), parse_nodes(nodes))


@pytest.mark.parametrize("cluster, world_size, said", [
    (SlurmCluster(nodes=3), 3,
     "in partition debug, SlurmCluster(nodes=3) asks for 3 nodes; the partition has 2: ask for at most 2"),
    (SlurmCluster(nodes=2, cpus_per_rank=3), 2,
     "1 rank per node x 3 CPUs = 3 CPUs per node; its largest node has 2 CPUs: ask for fewer ranks per node"),
    (SlurmCluster(nodes=2), 6, "3 ranks per node x 1 CPU = 3 CPUs per node; its largest node has 2 CPUs"),
    (SlurmCluster(partition="small"), 2,
     "in partition small, 2 ranks per node x 1 CPU = 2 CPUs per node; the partition allows 1 (MaxCPUsPerNode)"),
    (SlurmCluster(extra_options=["--mem=20G"]), 1,
     "--mem asks for 20480 MB per node; its largest node has 8000 MB of memory: ask for less memory"),
    (SlurmCluster(extra_options=["--mem-per-cpu=5000"]), 2, "--mem asks for 10000 MB per node; its largest node"),
    (SlurmCluster(partition="small", extra_options=["--mem=2000"]), 1,
     "--mem asks for 2000 MB per node; the partition allows 1000 MB (MaxMemPerNode)"),
    (SlurmCluster(partition="off"), 1,
     "in partition off, the partition is DOWN: it starts no job until the cluster's administrators bring it up"),
    (SlurmCluster(partition="gone"), 1, "in partition gone, the partition is INACTIVE: it takes no job"),
    (SlurmCluster(partition="dr"), 1, "in partition dr, the partition is DRAIN: it takes no job"),
    (SlurmCluster(partition="nope"), 1,
     "SlurmCluster(partition='nope'): no such partition; the cluster has debug (default), urgent, small, off "
     "(DOWN), gone (INACTIVE), dr (DRAIN)"),
    (SlurmCluster(partition="small", time="10"), 1,
     "SlurmCluster(time='10') is over the partition's time limit (MaxTime=00:05:00): ask for at most 00:05:00"),
    (SlurmCluster(gpus_per_rank=1), 1,
     "1 GPU per node asked for (gres gpu); none of its nodes has GPUs: ask for fewer GPUs per rank or per node, "
     "or choose a partition with GPU nodes"),
    (SlurmCluster(extra_options=["--gres=gpu:2"]), 1, "2 GPUs per node asked for (gres gpu); none of its nodes"),
    (SlurmCluster(partition="gone,dr"), 1, "in partition gone, the partition is INACTIVE: it takes no job; "
     "choose another partition (SlurmCluster(partition=...)) or ask the cluster's administrators; and in "
     "partition dr, the partition is DRAIN"),
], ids=["nodes", "cpus-per-rank", "cpus-per-node", "max-cpus-per-node", "mem", "mem-per-cpu", "max-mem-per-node",
        "partition-down", "partition-inactive", "partition-drain", "no-such-partition", "max-time", "gpus",
        "gres", "every-partition-listed"])
def test_a_job_that_can_never_start_is_named_with_what_the_cluster_has(cluster, world_size, said):
    found = why(cluster, world_size)
    assert found is not None and said in found, found


def test_more_nodes_than_a_partition_allows_a_job():
    found = why(SlurmCluster(nodes=2, partition="capped"), 2, PARTITIONS + ONE_NODE_PER_JOB + "\n",
                NODES.replace("Partitions=debug", "Partitions=capped,debug"))
    assert found == ("in partition capped, SlurmCluster(nodes=2) asks for 2 nodes; the partition has 2, and "
                     "allows 1 per job (MaxNodes): ask for at most 1")


def test_gpus_are_counted_from_the_nodes_gres():
    assert why(SlurmCluster(gpus_per_rank=2), 2, nodes=GPU_NODES) is None   # 2 ranks on node0's 4 GPUs
    found = why(SlurmCluster(gpus_per_rank=3), 2, nodes=GPU_NODES)
    assert found is not None and "6 GPUs per node asked for (gres gpu); its largest node has 4 GPUs" in found
    found = why(SlurmCluster(nodes=2, gpus_per_rank=1), 2, nodes=GPU_NODES)
    assert found is not None and "only 1 of its nodes have 1 GPUs" in found


@pytest.mark.parametrize("cluster, world_size", [
    (SlurmCluster(nodes=2), 4),
    (SlurmCluster(nodes=2, cpus_per_rank=2), 2),
    (SlurmCluster(partition="small", time="5"), 1),
    (SlurmCluster(partition="urgent", nodes=2, time="1-00:00:00"), 2),
    (SlurmCluster(partition="off,debug"), 1),   # the job runs in the first partition that can
    (SlurmCluster(extra_options=["--mem=0"]), 2),   # all of a node's memory, whatever it is
    (SlurmCluster(extra_options=["--mem=7G", "--qos=high"]), 2),
], ids=["fits", "whole-nodes", "at-max-time", "other-partition", "one-of-two", "all-memory", "mem-fits"])
def test_a_job_that_fits_is_let_through(cluster, world_size):
    assert why(cluster, world_size) is None


def test_nodes_that_do_not_name_their_partitions_are_not_taken_for_none():
    """A node record without Partitions= (a SLURM that leaves it out): the partition's TotalNodes
    counts, and the nodes' sizes are not held against the job."""
    nameless = NODES.replace("Partitions=debug,urgent,small,off,gone ", "").replace(
        "Partitions=debug,urgent,off,gone,dr ", "")
    assert "Partitions=" not in nameless
    assert why(SlurmCluster(nodes=2), 4, nodes=nameless) is None
    found = why(SlurmCluster(nodes=3), 3, nodes=nameless)
    assert found is not None and "asks for 3 nodes; the partition has 2: ask for at most 2" in found


def test_no_default_partition_asks_for_one():
    partitions = PARTITIONS.replace("Default=YES", "Default=NO")
    assert why(SlurmCluster(), 1, partitions) == (
        "the cluster has no default partition: give SlurmCluster(partition=...) one of debug, urgent, small, "
        "off (DOWN), gone (INACTIVE), dr (DRAIN)")


@pytest.mark.parametrize("reason", ["PartitionConfig", "PartitionNodeLimit", "PartitionTimeLimit", "PartitionDown",
                                    "BadConstraints", "QOSMaxNodePerJobLimit", "AssocMaxWallDurationPerJobLimit"])
def test_pending_reasons_that_never_end_are_known(reason):
    assert never_starting_reason(reason)


@pytest.mark.parametrize("reason", ["Resources", "Priority", "None", "ReqNodeNotAvail", "QOSGrpCpuLimit",
                                    "Dependency", "BeginTime"])
def test_pending_reasons_that_end_are_waited_for(reason):
    assert never_starting_reason(reason) is None


def test_a_timeout_in_the_queue_says_the_job_was_still_pending_and_why():
    assert still_pending(30, "12", "Resources").startswith(
        "timeout=30 s ran out before the ranks started: SLURM job 12 was still pending in the queue after 30 s: "
        "reason Resources (the nodes it needs are busy with other jobs). No rank ran")
    assert "salloc had not queued the job after 2 s" in still_pending(2, None, "")


def test_a_cancelled_job_is_not_waited_for_on_a_node_whose_slurmd_does_not_answer():
    """The node1 line of a job completing there after its slurmd died: the wait ends at once,
    saying so; while another node of the job still answers (its end is near), it goes on."""
    silent = [node for node in parse_nodes(COMPLETING_ON_A_SILENT_NODE) if node.name == "node1"]
    done, said = end_wait("23", True, "node1", silent, 0.5, False)
    assert done
    assert said == ("SLURM job 23 is cancelled but not yet ended on node1, whose slurmd does not answer "
                    "(node1: IDLE+COMPLETING+NOT_RESPONDING): not waiting for it (SLURM ends the job there once "
                    "the node answers again or is marked DOWN)")
    both = parse_nodes(COMPLETING_ON_A_SILENT_NODE.replace("State=IDLE ", "State=IDLE+COMPLETING ", 1))
    assert end_wait("23", True, "node[0-1]", both, 0.5, False) == (False, "")
    assert end_wait("23", True, "node1", parse_nodes(DOWN_NODE), 0.5, False)[0]


def test_a_long_wait_for_a_cancelled_jobs_end_is_said_once_and_bounded():
    answering = parse_nodes(NODES.replace("State=IDLE", "State=IDLE+COMPLETING"))
    assert end_wait("23", True, "node[0-1]", answering, SAY_AFTER / 2, False) == (False, "")
    done, said = end_wait("23", True, "node[0-1]", answering, SAY_AFTER + 1, False)
    assert not done and said.startswith(
        "waiting for SLURM to end job 23 on node[0-1] (COMPLETING: its processes there are being ended), ")
    assert end_wait("23", True, "node[0-1]", answering, SAY_AFTER + 2, True) == (False, "")
    done, said = end_wait("23", True, "node[0-1]", answering, GONE_TIMEOUT + 1, True)
    assert done and "still not ended" in said
    assert end_wait("23", False, "", [], 0.1, False) == (True, "")


@pytest.mark.parametrize("limit, seconds", [("30", 1800), ("5:30", 330), ("2:00:00", 7200), ("1-12", 129600),
                                            ("1-12:30", 131400), ("1-00:00:01", 86401), ("00:05:00", 300),
                                            ("UNLIMITED", None), ("INFINITE", None)])
def test_slurm_time_forms(limit, seconds):
    assert seconds_of(limit) == seconds


def test_sizes_gres_and_fields_with_spaces():
    assert [megabytes_of(size) for size in ("64G", "300M", "4096", "1T", "512K", "lots")] == [
        65536, 300, 4096, 1048576, 0, None]
    assert gpus_of("gpu:a100:4(S:0-1),gpu:v100:2") == 6
    assert gpus_of("gpu:2,shard:8") == 2 and gpus_of("(null)") == 0
    record = fields(DOWN_NODE)
    assert record["Reason"] == "Not responding [root@2026-11-29T03:39:38]"
    assert record["RealMemory"] == "8000" and record["OS"].startswith("Linux ")
