"""Fixtures for the Ray backend's tests: one real two-node Ray cluster per test module
(two network namespaces joined by a veth pair; see ray_two_nodes.py), torn down fully
after the module whatever happened. Skips, saying why, without root or iproute2."""
from __future__ import annotations

from typing import Any, Iterator

import pytest
from ray_two_nodes import RayTwoNodes, kernel_manager, unavailable_reason


@pytest.fixture(scope="module")
def ray_nodes(tmp_path_factory) -> Iterator[RayTwoNodes]:
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    nodes = RayTwoNodes(tmp_path_factory.mktemp("ray"))
    try:
        nodes.up()
        yield nodes
    finally:
        nodes.down()


@pytest.fixture
def node_a_kernel(ray_nodes, tmp_path) -> Iterator[Any]:
    """A fresh kernel manager for a notebook on node A (nbclient starts it); stopped afterwards."""
    km = kernel_manager(ray_nodes.namespaces[0], tmp_path)
    try:
        yield km
    finally:
        if km.has_kernel:
            km.shutdown_kernel(now=True)
