"""Each test's CPU seconds in the JUnit report (a ``cpu_s`` property), for tuning the run's time.

On the 2-core CI machine the suite's wall time follows the CPU its processes burn, and a test's
duration there says little (it waits for a core as much as it computes). This counts the CPU of the
test process and of every child it reaped during the test (kernels, ranks, fresh interpreters),
setup to teardown. A child reaped later (a module's kernel, reaped at the module's end) is counted
in the test during which it was reaped: add up a module's tests to see its whole cost
(``scripts/junit_cpu.py`` does)."""
from __future__ import annotations

import resource
from typing import Generator

import pytest

_START = pytest.StashKey[float]()


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:
    item.stash[_START] = _cpu_seconds()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Generator[None, None, None]:
    """Set before the teardown's report is made: the JUnit writer takes a test's properties from
    that report (xdist carries them from the worker)."""
    if call.when == "teardown" and _START in item.stash:
        spent = _cpu_seconds() - item.stash[_START]
        item.user_properties[:] = [(k, v) for k, v in item.user_properties if k != "cpu_s"]
        item.user_properties.append(("cpu_s", f"{spent:.2f}"))
    yield
