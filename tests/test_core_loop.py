"""The core loop on its own: Supervisor, EventReader framing and LineSplitter, without the launcher.

Ranks here are short-lived real processes forked by the test; each runs a few lines that
write to its pipes and exit the way the test needs (no backend, no rank bootstrap).
"""
from __future__ import annotations

import collections
import faulthandler
import os
import pickle
import signal
import sys
import time

import pytest

from notebook_launch.wire import protocol
from notebook_launch.channels import RankPipes
from notebook_launch.engines.local.fork import ForkedRank
from notebook_launch.display.base import Display
from notebook_launch.errors import LaunchError
from notebook_launch.wire.line_splitter import MAX_LINE, LineSplitter
from notebook_launch.record.logs import RunLogs
from notebook_launch.wire.protocol import EventKind, EventReader, EventWriter, Failure
from notebook_launch.record.state import DONE, FAILED, STOPPED, RankState, RunState
from notebook_launch.supervise import outcome, teardown
from notebook_launch.supervise.supervisor import Step, Supervisor

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork and pidfd: Linux")


# --- a tiny harness: forked children that do exactly what a test says --------------------------
def fork_ranks(bodies):
    """Start one child per body(writer) -> exit code; returns (processes, pipes)."""
    pipes = [RankPipes.open() for _ in bodies]
    processes = []
    for local, body in enumerate(bodies):
        pid = os.fork()
        if pid == 0:  # child: never returns
            code = 99
            try:
                os.setpgid(0, 0)
                mine = pipes[local]
                for other in pipes:
                    for fd in other.parent_ends() + (other.child_ends() if other is not mine else ()):
                        other.close(fd)
                os.dup2(mine.stdout_w, 1)
                os.dup2(mine.stderr_w, 2)
                code = body(EventWriter(mine.events_w))
            finally:
                os._exit(code)
        processes.append(ForkedRank(local, pid))
        pipes[local].close_child_ends()
    return processes, pipes


def supervise(tmp_path, bodies, **kwargs):
    processes, pipes = fork_ranks(bodies)
    state = RunState(run_id="unit", world_size=len(bodies), backend="test", log_dir=str(tmp_path),
                     ranks=[RankState(rank=i, local_rank=i) for i in range(len(bodies))])
    logs = RunLogs("unit", range(len(bodies)), range(len(bodies)), tmp_path)
    return Supervisor(processes, pipes, state, Display(), logs, **kwargs), state, pipes, logs


def returns(value):
    def body(writer):
        writer.send(EventKind.READY, {"pid": os.getpid(), "device": "cpu"})
        os.write(1, b"hello from the rank\n")
        writer.send(EventKind.RESULT, pickle.dumps(value))
        return 0
    return body


def raises(message, delay=0.0):
    def body(writer):
        time.sleep(delay)
        writer.send(EventKind.ERROR, protocol.error_payload(exc_type="ValueError", message=message))
        return 1
    return body


def sleeps(seconds=60.0, ignore_term=False):
    def body(writer):
        if ignore_term:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        writer.send(EventKind.READY, {"pid": os.getpid(), "device": "cpu"})
        time.sleep(seconds)
        return 0
    return body


def exits(code):
    return lambda writer: code


def killed_by(signum):
    def body(writer):
        faulthandler.disable()   # pytest's handler would print the crash into this test's output
        os.kill(os.getpid(), signum)
        time.sleep(10)
        return 0
    return body


# --- Supervisor ------------------------------------------------------------------------------
def test_results_come_back_in_rank_order_and_lines_reach_the_log(tmp_path):
    sup, state, _, logs = supervise(tmp_path, [returns("zero"), returns({"one": 1})])
    assert sup.run() == ["zero", {"one": 1}]
    assert [rs.status for rs in state.ranks] == [DONE, DONE]
    logs.close()
    assert "hello from the rank" in (tmp_path / "rank1.log").read_text()


def test_fail_fast_the_first_failure_is_reported_and_the_others_are_stopped(tmp_path):
    sup, state, _, logs = supervise(tmp_path, [sleeps(), raises("boom")])
    started = time.monotonic()
    with pytest.raises(LaunchError) as info:
        sup.run()
    logs.close()
    err = info.value
    assert err.rank == 1 and err.kind == "exception" and err.exc_type == "ValueError"
    assert str(err).splitlines()[0] == "rank 1 failed: ValueError: boom"
    assert state.ranks[0].status == STOPPED and state.ranks[1].status == FAILED
    assert "after rank 1 failed" in state.ranks[0].exit_description
    assert time.monotonic() - started < 30   # not the 60 s the sleeper wanted


def test_the_first_failure_stays_the_cause(tmp_path):
    sup, _, _, logs = supervise(tmp_path, [returns(0)])
    first = Failure(0, "exception", "ValueError: first")
    sup.fail(first)
    sup.fail(Failure(0, "exit", "exit code 1"))
    assert sup.first_failure is first
    with pytest.raises(LaunchError, match="ValueError: first"):
        sup.run()
    logs.close()


def test_teardown_escalates_to_sigkill_for_a_rank_that_ignores_sigterm(tmp_path, monkeypatch):
    monkeypatch.setattr(teardown, "TERM_GRACE", 0.3)
    sup, state, _, logs = supervise(tmp_path, [sleeps(ignore_term=True), raises("boom", delay=0.5)])
    with pytest.raises(LaunchError):
        sup.run()
    logs.close()
    assert state.ranks[0].status == STOPPED
    assert "SIGKILL" in state.ranks[0].exit_description
    assert sup.watches[0].stopped_by_us == signal.SIGKILL


def test_every_pipe_fd_is_closed_exactly_once(tmp_path, monkeypatch):
    sup, _, pipes, logs = supervise(tmp_path, [returns(1), raises("boom")])
    ours = {fd for p in pipes for fd in p.parent_ends()}
    closes: collections.Counter[int] = collections.Counter()   # fd -> how often os.close got it
    real_close = os.close

    def counting_close(fd):
        if fd in ours:
            closes[fd] += 1
        return real_close(fd)

    monkeypatch.setattr(os, "close", counting_close)
    with pytest.raises(LaunchError):
        sup.run()
    for p in pipes:            # what run_plan does afterwards must not close anything again
        p.close_parent_ends()
        p.close_child_ends()
    monkeypatch.undo()
    logs.close()
    assert set(closes) == ours and set(closes.values()) == {1}


def test_timeout_stops_everyone_and_names_the_ranks_still_running(tmp_path):
    sup, state, _, logs = supervise(tmp_path, [sleeps(), sleeps()], timeout=0.5)
    with pytest.raises(LaunchError) as info:
        sup.run()
    logs.close()
    assert info.value.kind == "timeout" and info.value.rank is None
    assert "timed out after 0.5 s; ranks still running: 0, 1" in str(info.value)
    assert [rs.status for rs in state.ranks] == [STOPPED, STOPPED]


@pytest.mark.parametrize("body, kind, words", [
    (exits(0), "exit", "exited with code 0 without returning"),
    (exits(3), "exit", "exit code 3 without raising a Python exception"),
    (killed_by(signal.SIGSEGV), "signal", "killed by SIGSEGV, segmentation fault"),
    (killed_by(signal.SIGKILL), "signal", "killed by SIGKILL (not by the kernel's out-of-memory killer: "),
])
def test_how_a_rank_ended_is_classified(tmp_path, body, kind, words):
    sup, state, _, logs = supervise(tmp_path, [body])
    with pytest.raises(LaunchError) as info:
        sup.run()
    logs.close()
    assert info.value.kind == kind and info.value.rank == 0
    assert words in str(info.value)
    assert state.ranks[0].status == FAILED


def test_a_result_that_cannot_be_unpickled_fails_the_run(tmp_path):
    def bad_result(writer):
        writer.send(EventKind.RESULT, b"not a pickle")
        return 0
    sup, _, _, logs = supervise(tmp_path, [bad_result])
    with pytest.raises(LaunchError) as info:
        sup.run()
    logs.close()
    assert info.value.kind == "result" and "could not be unpickled" in str(info.value)


def test_step_reports_finished_then_nothing_is_left_open(tmp_path):
    sup, _, _, logs = supervise(tmp_path, [returns(7)])
    deadline = time.monotonic() + 30
    while sup.step(0.05) is Step.RUNNING:
        assert time.monotonic() < deadline
    sup.close()
    logs.close()
    assert sup.load_results() == [7]
    assert not any(w.open_fds for w in sup.watches)


def test_outcome_never_writes_the_run_state(tmp_path):
    state = RunState(run_id="r", world_size=1, backend="test", log_dir=str(tmp_path),
                     ranks=[RankState(rank=0, local_rank=0)])
    before = (state.status, state.summary, state.ended_at)
    outcome.launch_error(Failure(0, "exception", "ValueError: x", "tb"), [None], state)
    outcome.remote_error(Failure(None, "exception", "ValueError: x", node=1, rank=3), state)
    assert (state.status, state.summary, state.ended_at) == before


# --- EventReader framing ----------------------------------------------------------------------
def frames(*events):
    out = bytearray()
    read, write = os.pipe()
    try:
        # lock_frames=False: the pipe must reach end-of-file in this same process, and a locking writer
        # keeps a description of the pipe of its own open while it lives (protocol.EventWriter)
        writer = EventWriter(write, lock_frames=False)
        for kind, payload in events:
            writer.send(kind, payload)
        os.close(write)
        while chunk := os.read(read, 1 << 16):
            out += chunk
    finally:
        os.close(read)
    return bytes(out)


def test_event_reader_decodes_frames_split_anywhere():
    data = frames((EventKind.READY, {"pid": 1, "device": "cpu"}), (EventKind.RESULT, b"x" * 1000),
                  (EventKind.PROGRESS, {"metrics": {"loss": 0.5}}))
    reader = EventReader()
    events = []
    for i in range(len(data)):              # one byte at a time
        events += reader.feed(data[i:i + 1])
    assert [kind for kind, _ in events] == [EventKind.READY, EventKind.RESULT, EventKind.PROGRESS]
    assert events[1][1] == b"x" * 1000
    assert all(isinstance(kind, EventKind) for kind, _ in events)


def test_event_reader_returns_every_whole_frame_of_one_chunk_and_keeps_the_rest():
    data = frames((EventKind.READY, {"pid": 1, "device": "cpu"}), (EventKind.ERROR, {"type": "E"}))
    reader = EventReader()
    assert len(reader.feed(data + data[:5])) == 2
    assert len(reader.feed(data[5:])) == 2
    assert reader.feed(b"") == []


# --- LineSplitter -------------------------------------------------------------------------------
def test_line_splitter_hands_on_whole_lines_only():
    split = LineSplitter()
    assert split.feed(b"par") == []
    assert split.feed(b"tial\nnext") == ["partial"]
    assert split.feed(b" line\n\n") == ["next line", ""]
    assert split.flush() == []


def test_line_splitter_keeps_what_follows_a_carriage_return_and_flushes_the_tail():
    split = LineSplitter()
    assert split.feed(b"10%\r50%\r100%\r\n") == ["100%"]
    assert split.feed(b"no newline at the end") == []
    assert split.flush() == ["no newline at the end"]
    assert split.flush() == []


def test_line_splitter_bounds_memory_and_survives_bad_utf8():
    split = LineSplitter()
    lines = split.feed(b"a" * (MAX_LINE + 10))
    assert lines == ["a" * MAX_LINE]
    assert split.flush() == ["a" * 10]
    assert split.feed(b"caf\xc3\xa9 \xff\n") == ["café \ufffd"]
