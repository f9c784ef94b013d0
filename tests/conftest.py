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

