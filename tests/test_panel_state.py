"""Run-state folding: what every display reads."""
from notebook_launch.record.state import DONE, FAILED, MAX_BARS, RUNNING, RankState, RunState
from notebook_launch.display import format as fmt


def make_state(world=2):
    return RunState(run_id="r1", world_size=world, backend="fork", log_dir="/tmp/logs",
                    ranks=[RankState(rank=i, local_rank=i) for i in range(world)])


def test_progress_events_fold_into_bars_and_metrics():
    state = make_state()
    state.on_ready(0, {"pid": 11, "device": "cpu"})
    state.on_progress(0, {"bars": {"b0": {"desc": "train", "n": 5, "total": 10, "unit": "it"}},
                          "metrics": {"loss": 0.5}})
    state.on_progress(0, {"bars": {"b0": {"n": 10, "rate": 100.0, "closed": True}},
                          "metrics": {"lr": 0.1}})
    rs = state.ranks[0]
    bar = rs.bars["b0"]
    assert (bar.desc, bar.n, bar.total, bar.rate, bar.closed) == ("train", 10, 10, 100.0, True)
    assert bar.fraction == 1.0
    assert rs.metrics == {"loss": 0.5, "lr": 0.1}
    assert rs.status == RUNNING and rs.pid == 11 and rs.updates == 2
    assert state.ranks[1].bars == {}


def test_main_bar_is_the_innermost_moving_bar_else_the_outer_loop():
    state = make_state(1)
    state.on_progress(0, {"bars": {"b0": {"desc": "epoch", "n": 1, "total": 3, "nested": 1},
                                   "b1": {"desc": "batch", "n": 50, "total": 100}}})
    assert state.ranks[0].main_bar.desc == "batch"
    state.on_progress(0, {"bars": {"b1": {"closed": True}}})
    assert state.ranks[0].main_bar.desc == "epoch"
    state.on_progress(0, {"bars": {"b0": {"closed": True, "n": 3}}})
    assert state.ranks[0].main_bar.desc == "epoch"


def test_bars_made_per_epoch_do_not_grow_without_bound():
    state = make_state(1)
    state.on_progress(0, {"bars": {"b0": {"desc": "epochs", "total": 1000}}})
    for i in range(1, 500):
        state.on_progress(0, {"bars": {f"b{i}": {"desc": "batch", "n": 10, "total": 10, "closed": True}}})
    bars = state.ranks[0].bars
    assert len(bars) <= MAX_BARS + 1
    assert "b0" in bars and "b499" in bars


def test_exit_and_failure_show_in_the_summary():
    state = make_state()
    state.on_progress(0, {"bars": {"b0": {"desc": "train", "n": 7, "total": 10}}})
    state.on_exit(0, DONE, "finished")
    state.on_exit(1, FAILED, "exit code 1", error="ValueError: boom")
    assert state.ranks[0].bars["b0"].closed
    text = fmt.summary(state)
    assert "rank 1 [cpu] failed" in text and "ValueError: boom" in text
    assert "train: 70% 7/10" in text
    assert "logs: /tmp/logs" in text and "r1" in text


def test_number_formats():
    assert fmt.duration(3725) == "1:02:05" and fmt.duration(65) == "01:05"
    assert fmt.count(50_000) == "50000" and fmt.count(250_000) == "250k" and fmt.count(3_000_000) == "3M"


def test_a_stalled_row_shows_neither_its_old_rate_nor_an_eta():
    """A rank with no sign of progress: its last rate is not its speed now and there is no ETA
    (issue 35); the counts stay. Every display reads it the same."""
    import io
    import time
    from rich.console import Console
    from notebook_launch.display import rows
    from notebook_launch.display.rich_panel import RichDisplay
    state = make_state(1)
    state.on_ready(0, {"pid": 11})
    state.on_progress(0, {"bars": {"b0": {"desc": "train", "n": 100, "total": 1000, "rate": 9.0}}})
    assert "9.0 it/s eta 01:40" in fmt.summary(state)
    state.on_stalled(0, time.monotonic() - 130)
    texts = {"summary": fmt.summary(state), "html": rows.row_html(state.ranks[0])}
    out = io.StringIO()
    rich = RichDisplay(console=Console(file=out, width=200, force_terminal=False, color_system=None))
    rich.start(state)
    rich.close(state)
    texts["rich"] = out.getvalue()
    for name, text in texts.items():
        assert "it/s" not in text and "eta" not in text, (name, text)
        assert "100/1000" in text, (name, text)
    assert "stalled 02:1" in texts["summary"]


def test_a_stopped_rank_says_stopped_once():
    """'rank 1 [cpu] stopped by notebook_launch ...', not 'stopped stopped by ...' (issue 35)."""
    from notebook_launch.record.state import STOPPED
    state = make_state()
    state.on_exit(0, STOPPED, "stopped by notebook_launch (SIGTERM) after the timeout")
    state.on_exit(1, STOPPED, "interrupted after an interrupt (alive, state kept)")
    text = fmt.summary(state)
    assert "rank 0 [cpu] stopped by notebook_launch (SIGTERM) after the timeout" in text, text
    assert "stopped stopped" not in text
    assert "rank 1 [cpu] stopped interrupted after an interrupt" in text, text
