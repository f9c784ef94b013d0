import os
import sys

import pytest

HERE = os.path.dirname(__file__)
sys.path.insert(0, HERE)  # for tests/helpers/ (nbutil and the other helper modules)


@pytest.fixture
def log_dir(tmp_path):
    """A run folder per test, so tests can read the per-rank logs."""
    return str(tmp_path / "logs")


@pytest.fixture(autouse=True)
def _isolated_log_root(tmp_path, monkeypatch):
    """Default log folders go under the test's tmp dir, not the user's cache."""
    monkeypatch.setenv("NOTEBOOK_LAUNCH_LOG_DIR", str(tmp_path / "runs"))


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (scripts/test.sh runs the main suite with several workers), the tests that
    share one resource run in one worker: tests/raycluster shares one two-node Ray cluster per
    session (its conftest), which each worker would otherwise start for itself."""
    for item in items:
        if "raycluster" in item.path.parts:
            item.add_marker(pytest.mark.xdist_group("raycluster"))
