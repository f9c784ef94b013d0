"""Fixtures for the Ray backend's tests: one real two-node Ray cluster (two network namespaces
joined by a veth pair; see ray_two_nodes.py) shared by this folder's modules, and torn down
fully after its last test, whatever happened. Starting a cluster costs about 30 s on the CI
machine, once instead of once per module; a module that ends by losing node B (the last test of
it) gets node B back for the next one (``RayTwoNodes.ensure_up``). The cluster is not kept for the
rest of the suite: idle Ray daemons would take CPU from every later test. Skips, saying why,
without root or iproute2."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator

import pytest
from ray_two_nodes import RayTwoNodes, kernel_manager, unavailable_reason

_shared: dict[str, RayTwoNodes] = {}


@pytest.fixture(scope="module")
def ray_nodes(tmp_path_factory) -> RayTwoNodes:
    reason = unavailable_reason()
    if reason:
        _say_started()
        pytest.skip(reason)
    nodes = _shared.get("nodes")
    if nodes is None:
        nodes = RayTwoNodes(tmp_path_factory.mktemp("ray"))
        _shared["nodes"] = nodes   # held before up(): a half-started cluster is taken down too
        try:
            nodes.up()
        finally:
            _say_started()
    else:
        nodes.ensure_up()
    return nodes


def _say_started() -> None:
    """Touch the file NOTEBOOK_LAUNCH_TEST_RAY_STARTED names (scripts/test.sh): the whole run starts
    the hosts' lanes once the cluster is up, started or given up on. Ray gives each raylet a fixed 30 s
    to register (a node that misses it is started again), and beside four lanes starting their
    kernels the cluster took 212 s to come up in one CI run instead of about 30."""
    marker = os.environ.get("NOTEBOOK_LAUNCH_TEST_RAY_STARTED")
    if marker:
        Path(marker).touch()


@pytest.fixture(scope="session", autouse=True)
def _ray_nodes_down_at_the_end() -> Iterator[None]:
    """The backstop: down at the session's end if no test of this folder came last."""
    yield
    _take_down()


@pytest.hookimpl(trylast=True)   # after the test's own fixtures are torn down (a kernel on node A)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Down right after this folder's last test (the next test is elsewhere, or none)."""
    if nextitem is None or nextitem.path.parent != item.path.parent:
        _take_down()


def _take_down() -> None:
    nodes = _shared.pop("nodes", None)
    if nodes is not None:
        nodes.down()
        _ray_cpu.append(nodes.cpu_seconds)


_ray_cpu: list[float] = []


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """What Ray's own processes burnt (its ranks' workers above all): not pytest's descendants, so the
    CI summary's CPU count for this folder leaves them out (scripts/test.sh)."""
    if _ray_cpu:
        terminalreporter.write_line(f"Ray's processes on the two nodes (daemons, and the workers that carried "
                                    f"the ranks) burnt {sum(_ray_cpu):.0f} s of CPU")


@pytest.fixture
def node_a_kernel(ray_nodes, tmp_path) -> Iterator[Any]:
    """A fresh kernel manager for a notebook on node A (nbclient starts it); stopped afterwards."""
    km = kernel_manager(ray_nodes.namespaces[0], tmp_path)
    try:
        yield km
    finally:
        if km.has_kernel:
            km.shutdown_kernel(now=True)
