import os
import sys
import time

import pytest

HERE = os.path.dirname(__file__)
sys.path.insert(0, HERE)  # for tests/helpers/ (nbutil and the other helper modules)

from helpers.xdist_groups import group_items  # noqa: E402

pytest_plugins = ["helpers.cpu_per_test"]   # each test's CPU in the JUnit report


@pytest.hookimpl(trylast=True)   # after xdist's own hook, which pytest 9 no longer hears (helpers/xdist_groups.py)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A module's tests that share a module-scoped fixture run on one xdist worker (built once)."""
    group_items(config, items)


@pytest.fixture
def log_dir(tmp_path):
    """A run folder per test, so tests can read the per-rank logs."""
    return str(tmp_path / "logs")


@pytest.fixture(autouse=True)
def _isolated_log_root(tmp_path, monkeypatch):
    """Default log folders go under the test's tmp dir, not the user's cache."""
    monkeypatch.setenv("NOTEBOOK_LAUNCH_LOG_DIR", str(tmp_path / "runs"))



@pytest.fixture(autouse=True)
def _no_zombie_left(request):
    """A child that ended and that nobody reaped (a ``Popen`` dropped unwaited, a helper that
    forgot its child) fails the test that made it, here, not the later tests of the same xdist
    worker that check a launch leaves no child (CI saw one zombie fail eleven of them). It is
    reaped so that those later tests still test their own launches."""
    import psutil
    before = {child.pid for child in psutil.Process().children()}
    yield
    deadline = time.monotonic() + 2   # a reaper thread may be about to take it
    while True:
        zombies = [child for child in psutil.Process().children()
                   if child.pid not in before and _is_zombie(child)]
        if not zombies or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for zombie in zombies:
        try:
            os.waitpid(zombie.pid, os.WNOHANG)
        except ChildProcessError:
            pass
    assert not zombies, f"{request.node.nodeid} left children that ended unreaped (zombies): {zombies}"


def _is_zombie(process) -> bool:
    import psutil
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
