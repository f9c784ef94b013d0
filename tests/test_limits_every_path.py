"""Limits on every path, checked before anything starts (issue 44, part 3): a launch on a cluster
(Ray, SLURM; a launch and persistent ranks) needs open files in the notebook too, one connection per
stream of every rank, and 200 cluster ranks at ``ulimit -n 256`` ended in a raw ``OSError: Too many
open files``; node 0 of a multi-node launch hosts the rendezvous store, which holds a connection from
every node and every rank; ``num_nodes=2**40`` was accepted and failed in torch's TCPStore
constructor; a Ray address's port was not checked. Each limit case runs in its own Python process
with a lowered RLIMIT_NOFILE."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from notebook_launch import LaunchArgumentError, RayCluster, notebook_launcher
from notebook_launch.planning.fd_budget import FDS_SPARE
from notebook_launch.planning.options import MAX_WORLD_SIZE, launch_options

LIMITED = textwrap.dedent("""
    import json, os, resource, sys
    resource.setrlimit(resource.RLIMIT_NOFILE, ({soft}, {hard}))
    from notebook_launch import RayCluster, SlurmCluster, notebook_launcher, start_ranks
    def fds():
        return sorted(int(n) for n in os.listdir("/proc/self/fd"))
    before = fds()
    outcome = {{}}
    try:
        {call}
        outcome["error"] = None
    except BaseException as exc:
        outcome["error"] = type(exc).__name__
        outcome["message"] = str(exc)
    outcome["leaked"] = sorted(set(fds()) - set(before))
    outcome["soft_after"] = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    outcome["ray_imported"] = "ray" in sys.modules
    print("OUTCOME " + json.dumps(outcome))
""")


def run_limited(tmp_path, call: str, *, soft: int = 256, hard: int = 256) -> dict:
    code = LIMITED.format(soft=soft, hard=hard, call=call)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240,
                          cwd=tmp_path)
    line = [x for x in proc.stdout.splitlines() if x.startswith("OUTCOME ")]
    assert line, proc.stdout + proc.stderr
    return json.loads(line[-1][len("OUTCOME "):])


CLUSTER_CALLS = {
    "ray launch": "notebook_launcher(print, num_processes=200, ui='none', cluster=RayCluster(address='127.0.0.1:1'))",
    "slurm launch": "notebook_launcher(print, num_processes=200, ui='none', cluster=SlurmCluster(nodes=2))",
    "ray persistent": "start_ranks(200, ui='none', cluster=RayCluster(address='127.0.0.1:1'))",
    "slurm persistent": "start_ranks(200, ui='none', cluster=SlurmCluster(nodes=2))",
}


@pytest.mark.parametrize("call", CLUSTER_CALLS.values(), ids=CLUSTER_CALLS.keys())
def test_cluster_ranks_past_the_open_file_limit_are_refused_before_anything_starts(tmp_path, call):
    outcome = run_limited(tmp_path, call)
    assert outcome["error"] == "LaunchArgumentError", outcome
    message = outcome["message"]
    assert message.startswith("num_processes=200 on the cluster needs about "), message
    assert "open-file limit is 256 (ulimit -n), hard limit 256" in message, message
    assert "each rank needs 5 (its four connections back to this notebook and its log file)" in message
    assert "fit under it: use num_processes=" in message and "ulimit -Hn" in message, message
    assert not outcome["ray_imported"], "nothing may start: Ray is imported only to connect"
    assert outcome["leaked"] == []


def test_the_soft_limit_is_raised_for_cluster_ranks_when_the_hard_limit_allows(tmp_path):
    # address=None with no ray.init(): the launch ends, after the check, saying to call ray.init
    outcome = run_limited(tmp_path, CLUSTER_CALLS["ray launch"].replace("'127.0.0.1:1'", "None"),
                          soft=256, hard=8192)
    assert outcome["error"] == "LaunchArgumentError" and "ray.init() was not called" in outcome["message"], outcome
    assert outcome["soft_after"] >= 5 * 200 + FDS_SPARE, outcome   # each rank 5, and the spare


def test_node_0_counts_the_rendezvous_stores_connections_from_every_node(tmp_path):
    """One local rank fits at 256 files, but node 0 of 300 nodes also holds the store's 600
    connections (one per node's agent, one per rank): refused before the store opens."""
    call = ("notebook_launcher(print, num_processes=1, num_nodes=300, node_rank=0, ui='none', "
            "master_addr='127.0.0.1', start_method='fork')")
    outcome = run_limited(tmp_path, call)
    assert outcome["error"] == "LaunchArgumentError", outcome
    message = outcome["message"]
    assert message.startswith("num_processes=1 on each of num_nodes=300 needs about "), message
    assert "300 for the rendezvous store's connections from the nodes" in message, message
    assert "connection to the rendezvous store per rank of every node" in message, message
    assert outcome["leaked"] == []


@pytest.mark.parametrize("num_nodes,num_processes", [(2**40, 2), (MAX_WORLD_SIZE, 2), (2**30, 4)])
def test_a_world_torch_cannot_number_is_refused(num_nodes, num_processes):
    with pytest.raises(LaunchArgumentError) as refused:
        launch_options(function=print, num_nodes=num_nodes, num_processes=num_processes, node_rank=1)
    assert f"on each of num_nodes={num_nodes} makes" in str(refused.value), refused.value
    assert "more than torch.distributed can number" in str(refused.value), refused.value


def test_a_cluster_world_torch_cannot_number_is_refused():
    with pytest.raises(LaunchArgumentError) as refused:
        notebook_launcher(print, num_processes=MAX_WORLD_SIZE + 1, cluster=RayCluster(address="127.0.0.1:1"))
    assert "more than torch.distributed can number" in str(refused.value), refused.value


@pytest.mark.parametrize("address", ["10.0.0.1:99999", "10.0.0.1:0", "head:", "ray://head:port", "[::1]:70000"])
def test_a_ray_address_with_a_port_no_tcp_port_can_be_is_refused(address):
    with pytest.raises(LaunchArgumentError) as refused:
        RayCluster(address=address)
    assert "must be a TCP port number between 1 and 65535" in str(refused.value), refused.value


@pytest.mark.parametrize("address", ["auto", None, "head:6379", "ray://head:10001", "[::1]:6379", "head"])
def test_ray_addresses_that_name_a_port_or_none_are_taken(address):
    assert RayCluster(address=address).address == address
