"""Failures at the edges are named for what they are: a Python exception is always one (even
when its str() raises or the function closed our fds), a rank we stopped is always "stopped",
and a huge exception message is capped in the error (the rank's log keeps all of it)."""
import os
import signal
import sys
import time

import pytest

from notebook_launch import LaunchError, notebook_launcher


def rank() -> int:
    return int(os.environ["RANK"])


class UnprintableError(Exception):
    def __str__(self):
        raise RuntimeError("__str__ itself fails")


def raise_unprintable():
    raise UnprintableError("payload")


def test_an_exception_whose_str_raises_is_named_as_an_exception(log_dir):
    with pytest.raises(LaunchError) as info:
        notebook_launcher(raise_unprintable, num_processes=1, log_dir=log_dir)
    err = info.value
    assert err.kind == "exception" and err.exc_type == "UnprintableError", str(err)
    assert str(err).startswith("rank 0 failed: UnprintableError: <str() failed")
    assert "without raising a Python exception" not in str(err)
    assert err.remote_traceback is not None
    assert "raise UnprintableError" in err.remote_traceback


def close_fds_then_raise():
    os.closerange(3, 4096)
    raise ValueError("after closing every fd above 2")


def close_fds_then_return():
    os.closerange(3, 4096)
    with open(os.devnull, "w") as reused:   # fd 3 again: the old event pipe's number
        reused.write("")
        return {"rank": rank()}


def test_an_exception_after_closing_every_fd_is_still_named(log_dir):
    with pytest.raises(LaunchError) as info:
        notebook_launcher(close_fds_then_raise, num_processes=1, log_dir=log_dir)
    assert str(info.value).startswith("rank 0 failed: ValueError: after closing every fd above 2")
    assert info.value.kind == "exception"


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_a_result_after_closing_every_fd_still_comes_back(log_dir, start_method):
    assert notebook_launcher(close_fds_then_return, num_processes=2, log_dir=log_dir,
                             start_method=start_method) == [{"rank": 0}, {"rank": 1}]


def close_fds_then_return_a_big_tensor():
    import torch
    os.closerange(3, 4096)   # the rank's shared-memory result file goes too
    with open(os.devnull, "w") as reused:   # a low fd number is someone else's now
        reused.write("")
        return torch.full((1 << 18,), float(rank()))   # 1 MiB: big enough for the result file


def test_tensors_returned_after_closing_every_fd_travel_inline(log_dir):
    import torch
    results = notebook_launcher(close_fds_then_return_a_big_tensor, num_processes=2, log_dir=log_dir)
    for r, tensor in enumerate(results):
        assert torch.equal(tensor, torch.full((1 << 18,), float(r)))


def clean_exit_on_sigterm():
    if rank() == 1:
        time.sleep(0.5)
        raise ValueError("rank 1 breaks")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))   # a handler that ends "cleanly"
    time.sleep(60)
    return "rank 0 finished?"


def test_a_rank_that_exits_cleanly_when_stopped_is_reported_stopped(log_dir):
    with pytest.raises(LaunchError) as info:
        notebook_launcher(clean_exit_on_sigterm, num_processes=2, log_dir=log_dir)
    text = str(info.value)
    assert text.startswith("rank 1 failed: ValueError: rank 1 breaks")
    assert "rank 0: stopped after rank 1 failed (it exited cleanly when asked)" in text, text
    assert "finished" not in text.split("Other ranks:")[1]
    assert info.value.results is not None
    assert info.value.results[0] is None, "a rank we stopped did not finish: it has no result"


def raise_on_sigterm():
    if rank() == 1:
        time.sleep(0.5)
        raise ValueError("rank 1 breaks")

    def handler(*_):
        raise RuntimeError("interrupted by SIGTERM")
    signal.signal(signal.SIGTERM, handler)
    time.sleep(60)


def test_a_rank_that_raises_when_stopped_is_reported_stopped_not_failed(log_dir):
    with pytest.raises(LaunchError) as info:
        notebook_launcher(raise_on_sigterm, num_processes=2, log_dir=log_dir)
    text = str(info.value)
    assert info.value.rank == 1 and text.startswith("rank 1 failed: ValueError: rank 1 breaks")
    assert "rank 0: stopped" in text and "also failed" not in text, text


HUGE = 5 * 1024 * 1024


def raise_huge():
    raise ValueError("A" * (HUGE // 2) + "B" * (HUGE // 2))


def test_a_huge_message_is_capped_in_the_error_and_whole_in_the_log(log_dir):
    with pytest.raises(LaunchError) as info:
        notebook_launcher(raise_huge, num_processes=1, log_dir=log_dir)
    err = info.value
    assert len(str(err)) < 64 * 1024, f"LaunchError text is {len(str(err))} characters"
    assert err.remote_traceback is not None and err.exc_message is not None
    assert len(err.remote_traceback) < 64 * 1024 and len(err.exc_message) < 64 * 1024
    first = str(err).splitlines()[0]
    assert first.startswith("rank 0 failed: ValueError: AAAA") and first.endswith("BBBB")
    assert "characters left out" in str(err) and os.path.join(log_dir, "rank0.log") in str(err)
    log = open(os.path.join(log_dir, "rank0.log")).read()
    assert log.count("A") >= HUGE // 2 and log.count("B") >= HUGE // 2, "the log keeps the whole message"
