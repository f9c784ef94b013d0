"""Fixtures for the SLURM engine's tests: one real two-node SLURM (slurmctld and two slurmd,
each node in its own network and UTS namespace; see slurm_two_nodes.py) shared by this folder's
modules, and torn down fully (daemons by pid, namespaces deleted) after its last test, whatever
happened: idle daemons would take CPU from every later test. Skips, saying why, without root,
iproute2, or Debian's slurm-wlm and munge."""
from __future__ import annotations

from typing import Iterator

import pytest
from slurm_two_nodes import SlurmTwoNodes, unavailable_reason

_shared: dict[str, SlurmTwoNodes] = {}


@pytest.fixture
def slurm(tmp_path_factory) -> SlurmTwoNodes:
    """The session's cluster, both nodes up and idle, with no job of an earlier test left in its queue."""
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    cluster = _shared.get("cluster")
    if cluster is None:
        cluster = SlurmTwoNodes(tmp_path_factory.mktemp("slurm"))
        _shared["cluster"] = cluster   # held before up(): a half-started cluster is taken down too
        cluster.up()
    else:
        cluster.ensure_up()
    return cluster


@pytest.fixture(scope="session", autouse=True)
def _slurm_down_at_the_end() -> Iterator[None]:
    """The backstop: down at the session's end if no test of this folder came last."""
    yield
    _take_down()


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Down right after this folder's last test (the next test is elsewhere, or none)."""
    if nextitem is None or nextitem.path.parent != item.path.parent:
        _take_down()


def _take_down() -> None:
    cluster = _shared.pop("cluster", None)
    if cluster is not None:
        cluster.down()
