"""Addresses the ranks or the notebook could never reach are refused within seconds, before any
rank starts, naming the address and what was tried (a master_addr that does not resolve or does not
lead back to node 0, a Ray address where nothing answers). Without these checks the cell hangs inside
C++ (torch's TCPStore client, ray.init) for minutes, where neither timeout= nor an interrupt reach.

Addresses of other hosts are only tried inside network namespaces this test makes (loopback and
the two ends of a veth pair): no packet leaves the machine."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from helpers.netns_pair import create_pair, delete_pair, ip, pair_names, unavailable_reason
from notebook_launch import notebook_launcher
from notebook_launch.errors import GuardError, LaunchArgumentError

pytestmark = pytest.mark.timeout(120)


def _never_called(path):
    with open(path, "w") as f:
        f.write("a rank ran")


@pytest.mark.parametrize("master_addr", ["not-a-host!!", "nosuchhost.invalid"])
@pytest.mark.parametrize("node_rank, num_nodes", [(0, 1), (1, 2)])
def test_master_addr_that_does_not_resolve_is_refused_before_any_rank(tmp_path, master_addr, node_rank,
                                                                      num_nodes):
    marker = tmp_path / "ran"
    started = time.monotonic()
    with pytest.raises(LaunchArgumentError) as info:
        notebook_launcher(_never_called, args=(str(marker),), num_processes=1, master_addr=master_addr,
                          node_rank=node_rank, num_nodes=num_nodes, timeout=60)
    text = str(info.value)
    assert f"master_addr={master_addr!r} does not resolve" in text
    assert "What to do" in text
    assert not marker.exists()
    assert time.monotonic() - started < 30   # refused, not timed out (generous: a loaded 2-core machine)


def test_master_addr_names_of_this_machine_still_launch():
    for addr in ("127.0.0.1", "localhost"):
        assert notebook_launcher(os.getpid, num_processes=1, master_addr=addr, timeout=120)[0] != os.getpid()


NAMESPACE_SCRIPT = """
import sys, time
from notebook_launch import notebook_launcher
from notebook_launch.errors import LaunchArgumentError
started = time.monotonic()
try:
    print("RESULT", notebook_launcher(lambda: "ok", num_processes=1, master_addr=sys.argv[1], timeout=120))
except LaunchArgumentError as err:
    print("REFUSED", round(time.monotonic() - started, 1), str(err).replace(chr(10), " "))
"""


@pytest.fixture
def namespaces():
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    names, links, addresses = pair_names("nladdr")
    create_pair(names, links, addresses)
    yield names, addresses
    delete_pair(names)


def _launch_in(namespace: str, master_addr: str) -> str:
    env = dict(os.environ, PYTHONPATH=os.getcwd(), NOTEBOOK_LAUNCH_LOG_DIR="")
    result = subprocess.run(["ip", "netns", "exec", namespace, sys.executable, "-c", NAMESPACE_SCRIPT, master_addr],
                            capture_output=True, text=True, timeout=100, env=env)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_master_addr_of_another_host_is_refused_on_node_0(namespaces):
    """Node 0 hosts the store: the other namespace's address (reachable, but not this host) and an
    address with no route from here are refused; this namespace's own address launches."""
    (here, _), (own, other) = namespaces
    out = _launch_in(here, other)
    assert "REFUSED" in out and f"master_addr={other!r} ({other}) is not an address of this machine" in out
    ip("-n", here, "route", "add", "unreachable", "198.18.0.0/15")
    out = _launch_in(here, "198.18.0.1")
    assert "REFUSED" in out and "is not an address of this machine" in out, out
    assert "RESULT ['ok']" in _launch_in(here, own)


@pytest.mark.parametrize("address, env", [
    ("127.0.0.1:1", {}),
    ("ray://127.0.0.1:1", {}),
    ("auto", {"RAY_ADDRESS": "127.0.0.1:1"}),
])
def test_ray_address_where_nothing_answers_fails_within_seconds(monkeypatch, address, env):
    """ray.init on a closed port retries for minutes inside C++; every way of naming the address is
    checked first."""
    pytest.importorskip("ray")
    from notebook_launch import RayCluster
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    started = time.monotonic()
    with pytest.raises(GuardError) as info:
        notebook_launcher(print, num_processes=1, cluster=RayCluster(address=address))
    text = str(info.value)
    assert f"address={address!r}" in text and "127.0.0.1:1 failed" in text, text
    assert "Nothing was started" in text and "ray start --head" in text
    assert time.monotonic() - started < 60
