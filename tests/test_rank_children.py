"""A rank's children never outlive the run, however the rank ends (issue 11, item D9)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from notebook_launch import LaunchError, notebook_launcher

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process groups and /proc: Linux")
SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]


def start_child_then(how: str, folder: str, new_session: bool = False):
    """Start a child that holds none of the rank's output, note its pid, then end as ``how`` says."""
    import ctypes
    import signal
    child = subprocess.Popen(SLEEPER, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=new_session)
    Path(folder, f"child-{os.environ['RANK']}").write_text(str(child.pid))
    if how == "os_exit":
        os._exit(3)
    if how == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "segfault":
        ctypes.string_at(0)
    if how == "raise":
        raise RuntimeError("the rank failed on purpose")
    return "returned"


def running(pid: int) -> bool:
    """Alive and not a zombie (an orphan killed here may stay a zombie of a non-reaping init)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def wait_until_gone(pid: int, limit: float = 10.0) -> bool:
    end = time.monotonic() + limit
    while running(pid) and time.monotonic() < end:
        time.sleep(0.05)
    return not running(pid)


def children_of(folder: Path) -> list[int]:
    return [int(p.read_text()) for p in sorted(folder.glob("child-*"))]


@pytest.mark.parametrize("how", ["os_exit", "sigkill", "segfault", "raise"])
def test_child_dies_with_a_rank_that_fails(tmp_path, how):
    with pytest.raises(LaunchError):
        notebook_launcher(start_child_then, args=(how, str(tmp_path)), num_processes=1, ui="none",
                          timeout=120)
    pids = children_of(tmp_path)
    assert len(pids) == 1
    try:
        assert wait_until_gone(pids[0]), f"the child {pids[0]} of a rank that ended by {how} outlived the run"
    finally:
        _kill(pids)


def test_child_dies_with_a_rank_that_returns(tmp_path):
    assert notebook_launcher(start_child_then, args=("return", str(tmp_path)), num_processes=2,
                             ui="none", timeout=120) == ["returned", "returned"]
    pids = children_of(tmp_path)
    try:
        assert len(pids) == 2 and all(wait_until_gone(pid) for pid in pids)
    finally:
        _kill(pids)


def test_child_in_a_new_session_is_swept_at_the_end(tmp_path):
    """setsid (start_new_session=True) leaves the rank's process group; the run's id in its
    environment still marks it as the run's."""
    with pytest.raises(LaunchError):
        notebook_launcher(start_child_then, args=("os_exit", str(tmp_path), True), num_processes=1,
                          ui="none", timeout=120)
    pids = children_of(tmp_path)
    try:
        assert len(pids) == 1 and wait_until_gone(pids[0])
    finally:
        _kill(pids)


def _kill(pids):
    import signal
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def child_then_fail_on_first_attempt(folder: str):
    """In attempt 0 rank 0 starts a child and dies by os._exit (rank 1 waits to be stopped);
    attempt 1 reports, on every rank, whether that child still runs."""
    if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
        if os.environ["RANK"] == "0":
            start_child_then("os_exit", folder)
        time.sleep(120)
    earlier = children_of(Path(folder))
    return [not wait_until_gone(pid) for pid in earlier]


def test_elastic_attempt_ends_its_children_before_the_next_one(tmp_path):
    results = notebook_launcher(child_then_fail_on_first_attempt, args=(str(tmp_path),), num_processes=2,
                                max_restarts=1, ui="none", timeout=120)
    pids = children_of(tmp_path)
    try:
        assert len(pids) == 1
        assert results == [[False], [False]], "a child of attempt 0 was alive in attempt 1"
    finally:
        _kill(pids)
