"""The main suite's workers build a module-scoped fixture once (scripts/test.sh runs it with ``-n 4
--dist loadgroup``; tests/helpers/xdist_groups.py makes the groups reach pytest 9): a real pytest with
four xdist workers runs a module whose twelve tests share a module fixture, and a module with an
``xdist_group`` mark, and each fixture build and each marked test writes down its worker."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
CONFTEST = f"""
import sys
sys.path.insert(0, {str(TESTS)!r})
import pytest
from helpers.xdist_groups import group_items

@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    group_items(config, items)
"""
SHARED = """
import os, pytest

@pytest.fixture(scope="module")
def built():
    with open(os.environ["WORKERS_LOG"] + ".fixture", "a") as f:
        f.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")

@pytest.mark.parametrize("i", range(12))
def test_shares_the_fixture(i, built):
    pass
"""
MARKED = """
import os, pytest

@pytest.mark.xdist_group("together")
@pytest.mark.parametrize("i", range(8))
def test_marked(i):
    with open(os.environ["WORKERS_LOG"] + ".marked", "a") as f:
        f.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")

@pytest.mark.parametrize("i", range(30))
def test_free(i):
    pass
"""


def run_suite(folder: Path, dist: str) -> tuple[set[str], set[str]]:
    for name, text in (("conftest.py", CONFTEST), ("test_shared.py", SHARED), ("test_marked.py", MARKED)):
        (folder / name).write_text(text)
    log = folder / f"workers-{dist}"
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-n", "4",
                           "--dist", dist, str(folder)], cwd=folder, capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, WORKERS_LOG=str(log)))
    assert done.returncode == 0 and "50 passed" in done.stdout, done.stdout + done.stderr
    return (set(Path(f"{log}.fixture").read_text().split()), set(Path(f"{log}.marked").read_text().split()))


def test_a_module_fixture_is_built_once_and_a_marked_group_runs_on_one_worker(tmp_path):
    fixture_workers, marked_workers = run_suite(tmp_path, "loadgroup")
    assert len(fixture_workers) == 1, f"the module fixture was built on {sorted(fixture_workers)}"
    assert len(marked_workers) == 1, f"the xdist_group's tests ran on {sorted(marked_workers)}"
