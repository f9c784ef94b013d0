"""The Session around every supervised stretch of ranks (a launch, one call on persistent
ranks), checked without starting any rank: the display starts and closes once with the
final state, the signal handlers come back exactly, the logs close (a call's section only
flushes the pool's files), and a failure finishes the state FAILED."""
from __future__ import annotations

import signal

import pytest

from notebook_launch.scaffold import session as session_module
from notebook_launch.display.base import Display
from notebook_launch.errors import LaunchError
from notebook_launch.record.logs import LogSection, RunLogs
from notebook_launch.planning.options import LaunchOptions
from notebook_launch.wire.plan import build_plan
from notebook_launch.scaffold.session import Session, launch_line, open_logs, plan_state
from notebook_launch.record.state import DONE, FAILED, RUNNING, STARTING, STOPPED, RunState
from notebook_launch.notebook import interrupt_gate


class RecordingDisplay(Display):
    """Says what the session asked of it, and the state's status each time."""

    def __init__(self, fail_on_start: bool = False) -> None:
        super().__init__()
        self.calls: list[tuple[str, str]] = []
        self.fail_on_start = fail_on_start

    def start(self, state: RunState) -> None:
        self.calls.append(("start", state.status))
        if self.fail_on_start:
            raise RuntimeError("the panel could not be drawn")

    def close(self, state: RunState) -> None:
        self.calls.append(("close", state.status))


class RecordingLogs:
    """A LogWriter that counts its closes."""

    def __init__(self, path) -> None:
        self.path = path
        self.closed = 0

    def write_line(self, local_rank: int, stream: str, text: str) -> None:
        pass

    def write_block(self, local_rank: int, text: str) -> None:
        pass

    def write_metrics(self, rank: int, series) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed += 1


class RecordingRankDisplays:
    made: list["RecordingRankDisplays"] = []

    def __init__(self, ranks, run_id: str) -> None:
        self.ranks, self.run_id, self.closed = ranks, run_id, 0
        RecordingRankDisplays.made.append(self)

    def close(self) -> None:
        self.closed += 1


def a_plan(num_processes: int = 2):
    return build_plan(num_processes=num_processes, num_nodes=1, node_rank=0, master_addr="127.0.0.1",
                      master_port=29500, device_kind="cpu", mixed_precision="no", start_method="fork",
                      run_id="r", user_env={}, cpu_count=4)


def a_session(tmp_path, display: RecordingDisplay | None = None) -> tuple[Session, RecordingDisplay, RecordingLogs]:
    display = display or RecordingDisplay()
    logs = RecordingLogs(tmp_path)
    state = plan_state(a_plan(), "run", "fork", tmp_path)
    return Session(state, logs, display), display, logs


@pytest.fixture
def own_handlers():
    """Handlers of the notebook's own, put back after the test whatever it did."""
    def notebook_sigterm(signum, frame):
        pass

    def notebook_sigint(signum, frame):
        pass

    before = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    signal.signal(signal.SIGTERM, notebook_sigterm)
    signal.signal(signal.SIGINT, notebook_sigint)
    try:
        yield {signal.SIGTERM: notebook_sigterm, signal.SIGINT: notebook_sigint}
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def test_a_run_that_finishes_is_done_and_shown_once(tmp_path):
    session, display, logs = a_session(tmp_path)
    with session:
        assert display.calls == [("start", "running")]
        session.finish("2 ranks finished")
    assert session.state.status == DONE and session.state.summary == "2 ranks finished"
    assert display.calls == [("start", "running"), ("close", "done")]
    assert logs.closed == 1


def test_a_launch_error_finishes_the_state_failed_with_its_first_line(tmp_path):
    session, display, logs = a_session(tmp_path)
    with pytest.raises(LaunchError):
        with session:
            raise LaunchError("rank 1 failed: ValueError: boom\nthe traceback follows")
    assert session.state.status == FAILED
    assert session.state.summary == "rank 1 failed: ValueError: boom"
    assert display.calls == [("start", "running"), ("close", "failed")]
    assert logs.closed == 1


def test_a_run_the_user_stopped_is_stopped_not_failed(tmp_path):
    """Stop (or an interrupt) on a stalled run ends it with a LaunchError that says where the
    ranks were: it is headed "stopped", as an interrupt on any other run is (issue 35)."""
    from notebook_launch.display import format as fmt
    session, display, _ = a_session(tmp_path)
    with pytest.raises(LaunchError):
        with session:
            raise LaunchError("stopped with the Stop button after the run stalled: rank 1 is in f()", kind="stopped")
    assert session.state.status == STOPPED
    assert display.calls == [("start", "running"), ("close", "stopped")]
    assert ", stopped, " in fmt.header(session.state)


def test_the_first_failure_is_the_one_shown(tmp_path):
    session, display, _ = a_session(tmp_path)
    with pytest.raises(LaunchError):
        with session:
            session.fail(LaunchError("the first"))
            raise LaunchError("the same, with a note added")
    assert session.state.summary == "the first"
    assert display.calls[-1] == ("close", "failed")


def test_an_interrupt_stops_the_run(tmp_path):
    session, display, logs = a_session(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        with session:
            raise KeyboardInterrupt
    assert session.state.status == STOPPED and session.state.summary == "interrupted"
    assert display.calls == [("start", "running"), ("close", "stopped")]
    assert logs.closed == 1


def test_signal_handlers_come_back_exactly(tmp_path, own_handlers):
    session, _, _ = a_session(tmp_path)
    with session:
        assert signal.getsignal(signal.SIGINT) is interrupt_gate.on_sigint   # a second Ctrl-C only counts
        signal.signal(signal.SIGTERM, signal.SIG_IGN)   # what torch elastic or Ray would leave behind
    assert signal.getsignal(signal.SIGTERM) is own_handlers[signal.SIGTERM]
    assert signal.getsignal(signal.SIGINT) is own_handlers[signal.SIGINT]


def test_a_display_that_cannot_start_still_ends_the_session(tmp_path, own_handlers):
    session, display, logs = a_session(tmp_path, RecordingDisplay(fail_on_start=True))
    with pytest.raises(RuntimeError, match="could not be drawn"):
        with session:
            pytest.fail("the body runs only once the display started")
    assert display.calls == [("start", "running"), ("close", "stopped")]
    assert logs.closed == 1
    assert signal.getsignal(signal.SIGTERM) is own_handlers[signal.SIGTERM]
    assert signal.getsignal(signal.SIGINT) is own_handlers[signal.SIGINT]


def test_a_session_is_used_once(tmp_path):
    session, display, logs = a_session(tmp_path)
    with session:
        session.finish("done")
    with pytest.raises(RuntimeError, match="used once"):
        with session:
            pass
    assert display.calls.count(("start", "running")) == 1 and logs.closed == 1


def test_the_ranks_display_outputs_close_in_a_kernel(tmp_path, monkeypatch):
    RecordingRankDisplays.made.clear()
    monkeypatch.setattr(session_module, "in_ipython_kernel", lambda: True)
    monkeypatch.setattr(session_module, "RankDisplays", RecordingRankDisplays)
    state = plan_state(a_plan(), "run-7", "fork", tmp_path)
    session = Session(state, RecordingLogs(tmp_path), RecordingDisplay(), frozenset({1}))
    with session:
        session.finish("done")
    [made] = RecordingRankDisplays.made
    assert session.rank_displays is made
    assert (made.ranks, made.run_id, made.closed) == (frozenset({1}), "run-7", 1)


def test_a_launch_session_opens_the_run_folder_and_prints_the_launch_line(tmp_path, capsys):
    options = LaunchOptions(function=print, ui="none", log_dir=tmp_path / "logs")
    session = Session.for_launch(a_plan(), options, run_id="run-1", backend="fork", platform="kaggle-cpu",
                                 extra_lines=("notebook_launch: one more line",))
    assert isinstance(session.logs, RunLogs)
    out = capsys.readouterr().out
    assert out.startswith("notebook_launch: 2 ranks on kaggle-cpu (CPU, gloo, fork)")
    assert out.rstrip().endswith(f"logs: {tmp_path / 'logs'}\nnotebook_launch: one more line")
    assert [r.rank for r in session.state.ranks] == [0, 1]
    assert session.state.run_id == "run-1" and session.state.log_dir == str(tmp_path / "logs")
    with session:
        session.logs.write_line(1, "stdout", "hello")
        session.finish("2 ranks finished")
    assert (tmp_path / "logs" / "rank1.log").read_text() == "hello\n"
    assert session.state.status == DONE


def test_a_call_session_writes_a_section_and_leaves_the_pool_logs_open(tmp_path):
    logs = open_logs(a_plan(), "pool", LaunchOptions(function=print, log_dir=tmp_path))
    state = plan_state(a_plan(), "pool-call1", "fork, persistent", logs.path)
    session = Session.for_call(logs, "call 1: run(f)", state, LaunchOptions(function=print, ui="auto"),
                               quiet=True)
    assert isinstance(session.logs, LogSection) and session.display.name == "none"   # quiet: no panel
    with session:
        session.logs.write_line(0, "stdout", "in the call")
        session.logs.write_metrics(0, {"loss": [0.5]})
        session.finish("2 ranks returned")
    logs.write_line(0, "stdout", "after the call")   # the pool's files are still open
    logs.close()
    assert (tmp_path / "rank0.log").read_text() == "----- call 1: run(f) -----\nin the call\nafter the call\n"
    assert (tmp_path / "rank1.log").read_text() == "----- call 1: run(f) -----\n"
    assert '"loss"' in (tmp_path / "metrics.jsonl").read_text()


def test_plan_state_of_running_ranks_shows_their_pids(tmp_path):
    class Process:
        def __init__(self, pid: int) -> None:
            self.pid = pid

    fresh = plan_state(a_plan(), "run", "fork", tmp_path, max_restarts=2)
    assert [(r.pid, r.status) for r in fresh.ranks] == [(None, STARTING), (None, STARTING)]
    assert fresh.max_restarts == 2
    running = plan_state(a_plan(), "run-call1", "fork, persistent", tmp_path,
                         processes=[Process(101), Process(102)])   # type: ignore[list-item]
    assert [(r.pid, r.status) for r in running.ranks] == [(101, RUNNING), (102, RUNNING)]


def test_the_launch_line_says_where_the_logs_went_when_not_where_expected(tmp_path):
    logs = open_logs(a_plan(1), "run", LaunchOptions(function=print, log_dir=tmp_path))
    logs.notes.append("cannot write logs under /nowhere; this run's logs go to /tmp/x")
    try:
        line = launch_line(a_plan(1), "spawn, persistent", logs, display="text")
    finally:
        logs.close()
    assert line.splitlines()[0].startswith("notebook_launch: 1 rank (CPU, gloo, spawn, persistent)")
    assert line.splitlines()[-1] == "notebook_launch: cannot write logs under /nowhere; this run's logs go to /tmp/x"


def test_a_launch_shows_the_display_its_options_name_or_the_callers_own(tmp_path, capsys):
    """``ui=`` a name: the session makes that display with the options' settings; ``ui=`` a
    Display the caller made (a display of their own, as the tests' recording ones): the session
    drives that very display, with the run's own RunState."""
    from notebook_launch.display.html import HtmlDisplay
    named = Session.for_launch(a_plan(), LaunchOptions(function=print, ui="html", log_dir=tmp_path / "named",
                                                       lines_per_second=7), run_id="run-1", backend="fork")
    named.logs.close()
    # a notebook panel, drawn once the run lasts (display/deferred.py): the one it would draw
    from helpers.panel_helpers import panel_of
    from notebook_launch.display.deferred import DeferredPanel
    assert isinstance(named.display, DeferredPanel) and named.display.name == "html"
    panel = panel_of(named.display)
    assert type(panel) is HtmlDisplay and panel.lines is not None
    assert panel.lines.budget == 7
    display = RecordingDisplay()
    options = LaunchOptions(function=print, ui=display, log_dir=tmp_path / "own", lines_per_second=7)
    session = Session.for_launch(a_plan(), options, run_id="run-2", backend="fork")
    with session:
        session.finish("done")
    assert session.display is display and type(session.state) is RunState
    assert display.calls == [("start", "running"), ("close", "done")]
    assert ", display none;" in capsys.readouterr().out
