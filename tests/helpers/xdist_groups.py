"""Keep a module's tests on one pytest-xdist worker when they share a module-scoped fixture.

Why: under ``-n 4`` xdist hands tests out in chunks, and a module whose tests straddle two chunks
builds its module fixture (a benchmark run of minutes, a kernel that ran a notebook) once in each
worker that got some of them: CI saw test_only_users_code.py's fixture built twice (48 s each). The
``xdist_group`` mark with ``--dist loadgroup`` (scripts/test.sh) is xdist's answer, but xdist 3.8
writes the group into ``item._nodeid``, which pytest 9 no longer reads (a node's id lives in
``item._id``): the marks did nothing. ``group_items`` writes the group where pytest 9 reads it, for
every ``xdist_group`` mark and, without a mark, for every test that uses a module- or class-scoped
fixture (grouped by its module), so a new module with such a fixture needs no mark to be built once.
"""
from __future__ import annotations

from typing import Sequence

import pytest

SHARED_SCOPES = ("module", "class")


def group_of(item: pytest.Item) -> str | None:
    """The worker group of a test: its xdist_group marks' names, else its module when it uses a
    fixture built once per module or class, else none (any worker may run it)."""
    names = {str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
             for mark in item.iter_markers("xdist_group")}
    if names:
        return "_".join(sorted(names))
    info = getattr(item, "_fixtureinfo", None)
    for definitions in (info.name2fixturedefs.values() if info is not None else ()):
        if definitions and definitions[-1].scope in SHARED_SCOPES:
            return item.nodeid.split("::", 1)[0]
    return None


def group_items(config: pytest.Config, items: Sequence[pytest.Item]) -> None:
    """On an xdist worker run with ``--dist loadgroup``: suffix each grouped test's id with
    ``@group``, which the controller's loadgroup scheduler sends to one worker as one unit."""
    if not getattr(config.option, "loadgroup", False):   # set on the workers (xdist.remote)
        return
    for item in items:
        group = group_of(item)
        node_id = getattr(item, "_id", None)
        if group is None or node_id is None or "@" in str(node_id).rpartition("]")[2]:
            continue   # ungrouped; an older pytest (xdist set _nodeid itself); already suffixed
        item._id = type(node_id).parse(f"{node_id}@{group}")
