"""SlurmCluster(...) checks its fields when it is made, and a SLURM launch refuses what it cannot
honour before anything is submitted (no SLURM needed: nothing reaches the scheduler)."""
from __future__ import annotations

import pytest

from notebook_launch import LaunchArgumentError, SlurmCluster, notebook_launcher
from notebook_launch.errors import GuardError


def test_a_good_description_is_kept():
    cluster = SlurmCluster(nodes=2, cpus_per_rank=4, gpus_per_rank=1, partition="gpu", time="2:00:00",
                           account="lab", extra_options=["--qos=high", "--mem=64G"], python="/opt/venv/bin/python")
    assert cluster.extra_options == ("--qos=high", "--mem=64G")
    assert cluster.device_kind == "cuda"
    assert SlurmCluster().device_kind == "cpu"


@pytest.mark.parametrize("time", ["30", "30:00", "2:00:00", "1-12", "1-12:30", "1-12:30:00", "UNLIMITED"])
def test_slurm_time_forms_are_taken(time):
    assert SlurmCluster(time=time).time == time


@pytest.mark.parametrize("kwargs, says", [
    ({"nodes": 0}, "nodes=...) must be a whole number >= 1"),
    ({"nodes": 2.0}, "nodes=...) must be a whole number >= 1"),
    ({"nodes": True}, "nodes=...) must be a whole number >= 1"),
    ({"cpus_per_rank": 0}, "cpus_per_rank=...) must be a whole number >= 1"),
    ({"gpus_per_rank": -1}, "gpus_per_rank=...) must be a whole number >= 0"),
    ({"gpus_per_rank": 0.5}, "gpus_per_rank=...) must be a whole number >= 0"),
    ({"partition": ""}, "partition=...) must be a name without spaces"),
    ({"partition": "gpu nodes"}, "partition=...) must be a name without spaces"),
    ({"account": 7}, "account=...) must be a name without spaces"),
    ({"time": "2h"}, "is not a SLURM time limit"),
    ({"time": 120}, "is not a SLURM time limit"),
    ({"extra_options": "--qos=high"}, "must be a list or tuple of salloc options"),
    ({"extra_options": ["qos=high"]}, "each starting with '-'"),
    ({"extra_options": [3]}, "each starting with '-'"),
    ({"extra_options": ["--nodes=3"]}, "which SlurmCluster sets itself from nodes"),
    ({"extra_options": ["-N3"]}, "which SlurmCluster sets itself from nodes"),
    ({"extra_options": ["--time=10"]}, "which SlurmCluster sets itself from time"),
    ({"extra_options": ["--job-name=x"]}, "the job name is the run's"),
    ({"python": "python3"}, "absolute path of the interpreter"),
])
def test_bad_fields_are_refused_when_made(kwargs, says):
    with pytest.raises(LaunchArgumentError, match=None) as caught:
        SlurmCluster(**kwargs)
    assert says in str(caught.value)


def test_ranks_that_do_not_spread_evenly_are_refused_before_anything_is_submitted():
    with pytest.raises(LaunchArgumentError, match="cannot be spread evenly over SlurmCluster\\(nodes=2\\)"):
        notebook_launcher(print, num_processes=3, cluster=SlurmCluster(nodes=2))


@pytest.mark.parametrize("kwargs, says", [
    ({"num_nodes": 2}, "the cluster places the ranks on its nodes"),
    ({"start_method": "spawn"}, "cannot be combined with cluster="),
])
def test_launch_arguments_a_slurm_run_cannot_honour(kwargs, says):
    with pytest.raises(LaunchArgumentError) as caught:
        notebook_launcher(print, num_processes=2, cluster=SlurmCluster(nodes=1), **kwargs)
    assert says in str(caught.value)


def test_max_restarts_is_taken_by_a_slurm_launch(monkeypatch, tmp_path):
    """max_restarts passes the launch's argument checks (a SLURM launch restarts in its allocation):
    with no SLURM command on PATH, the first thing to refuse it is the check for them."""
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(GuardError, match="needs SLURM's commands on this machine"):
        notebook_launcher(print, num_processes=2, cluster=SlurmCluster(nodes=1), max_restarts=2)


def test_a_wrong_cluster_type_names_both_engines():
    with pytest.raises(LaunchArgumentError, match="RayCluster\\(...\\), a notebook_launch.SlurmCluster"):
        notebook_launcher(print, num_processes=2, cluster="slurm")  # type: ignore[arg-type]


@pytest.mark.parametrize("kwargs, says", [
    ({"num_processes": 3, "cluster": SlurmCluster(nodes=2)}, "cannot be spread evenly over SlurmCluster(nodes=2)"),
    ({"num_processes": 2, "cluster": SlurmCluster(nodes=1), "start_method": "fork"},
     "start_method='fork' cannot be combined with cluster="),
    ({"num_processes": None, "cluster": SlurmCluster(nodes=1)}, "num_processes must be the total number of ranks"),
], ids=["uneven", "start-method", "no-count"])
def test_persistent_ranks_on_slurm_check_their_arguments_before_anything_is_queued(kwargs, says):
    """start_ranks(cluster=SlurmCluster(...)) is accepted (tests/slurmcluster runs it on a real
    SLURM); what it cannot honour is said before salloc runs."""
    from notebook_launch import start_ranks
    with pytest.raises(LaunchArgumentError) as caught:
        start_ranks(**kwargs)
    assert says in str(caught.value)
