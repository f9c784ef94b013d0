"""Code written for Accelerate catches torch elastic's ChildFailedError around notebook_launcher
(Accelerate's own test_notebook.py::test_monitoring does); LaunchError must be caught there too."""
import os
import time

import pytest
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from notebook_launch import LaunchError, notebook_launcher


def bipolar_sleep_function(sleep_sec):
    """Accelerate's test_monitoring function, without PartialState: even ranks fail, odd ones sleep."""
    if int(os.environ["RANK"]) % 2 == 0:
        raise RuntimeError("I'm an even process. I don't like to sleep.")
    time.sleep(sleep_sec)


def test_accelerate_monitoring_pattern_catches_child_failed_error(log_dir):
    start = time.time()
    with pytest.raises(ChildFailedError, match="I'm an even process. I don't like to sleep."):
        notebook_launcher(bipolar_sleep_function, (100,), num_processes=2, monitor_interval=0.01,
                          log_dir=log_dir)
    assert time.time() - start < 100, "Monitoring did not stop the process in time."


def test_launch_error_fills_child_failed_error_fields(log_dir):
    try:
        notebook_launcher(bipolar_sleep_function, (100,), num_processes=2, log_dir=log_dir)
    except ChildFailedError as err:
        caught = err
    assert isinstance(caught, LaunchError) and isinstance(caught, RuntimeError)
    assert caught.name == "bipolar_sleep_function"          # torch names the entrypoint
    assert caught.rank == 0 and caught.kind == "exception" and caught.exc_type == "RuntimeError"
    assert list(caught.failures) == [0], "failures holds the failed ranks only, by global rank"
    failure = caught.failures[0]
    assert isinstance(failure, ProcessFailure)
    # torch's record has no global rank: notebook_launch adds .rank to it (supervise/child_failed.py)
    assert failure.local_rank == 0 and failure.rank == 0 and failure.exitcode == 1 and failure.pid > 0  # type: ignore[attr-defined]
    assert os.path.isfile(failure.error_file), "torch's error file (JSON) is written in the log folder"
    assert isinstance(failure.message, dict) and "I don't like to sleep" in failure.message["message"]
    assert "bipolar_sleep_function" in failure.message["extraInfo"]["py_callstack"]
    assert failure.timestamp > 0
    assert caught.get_first_failure() == (0, failure)
    assert "Root Cause" in caught.format_msg()               # torch's own formatting still works
    assert str(caught).startswith("rank 0 failed: RuntimeError: I'm an even process")


def killed_by_signal():
    if int(os.environ["RANK"]) == 1:
        os.kill(os.getpid(), 9)
    time.sleep(100)


def test_a_rank_killed_by_a_signal_has_torchs_negative_exitcode(log_dir):
    with pytest.raises(ChildFailedError) as info:
        notebook_launcher(killed_by_signal, num_processes=2, log_dir=log_dir)
    failure = info.value.failures[1]
    assert failure.exitcode == -9 and failure.signal_name() == "SIGKILL"
    assert failure.error_file == "<N/A>"


def test_a_timeout_is_a_child_failed_error_naming_the_ranks_it_stopped(log_dir):
    with pytest.raises(ChildFailedError) as info:
        notebook_launcher(time.sleep, (100,), num_processes=2, timeout=1, log_dir=log_dir)
    assert isinstance(info.value, LaunchError)   # caught as torch's type, raised as ours
    assert info.value.kind == "timeout" and sorted(info.value.failures) == [0, 1]
    assert all(f.exitcode == -15 for f in info.value.failures.values())


def test_accelerates_own_test_monitoring_passes_with_our_launcher(monkeypatch):
    """Accelerate's test_notebook.py::test_monitoring itself, with notebook_launcher swapped for
    ours: it expects ChildFailedError with the even rank's message, well before the odd rank's sleep."""
    script = pytest.importorskip("accelerate.test_utils.scripts.test_notebook")
    monkeypatch.setattr(script, "notebook_launcher", notebook_launcher)
    monkeypatch.setattr(script, "NUM_PROCESSES", 2)
    script.test_monitoring()


class SlowFlushStdout:
    """A user's sys.stdout whose flush takes a while: the rank's exit (which flushes) comes
    well after its ERROR, the window in which a teardown SIGTERM used to turn exit 1 into -15."""

    def __init__(self, inner):
        self.inner = inner

    def write(self, text):
        return self.inner.write(text)

    def flush(self):
        time.sleep(1.0)
        self.inner.flush()


def fails_then_exits_slowly():
    import sys
    if int(os.environ["RANK"]) == 0:
        sys.stdout = SlowFlushStdout(sys.stdout)
        raise RuntimeError("rank 0 failed on its own")
    time.sleep(100)


def test_the_failing_rank_keeps_its_own_exit_code_while_the_others_are_stopped(log_dir):
    with pytest.raises(ChildFailedError) as info:
        notebook_launcher(fails_then_exits_slowly, num_processes=2, log_dir=log_dir)
    assert list(info.value.failures) == [0]
    assert info.value.failures[0].exitcode == 1, "the rank that raised was not sent our SIGTERM"
    assert "rank 0 failed on its own" in str(info.value)
    assert "stopped" in str(info.value) and "rank 1" in str(info.value)
