"""The widget panel's traffic to the frontend stays bounded whatever the step rate.

The widgets are real ipywidgets; only the comm under them is a recording stand-in
for the browser, and the clock is simulated so the test does not depend on speed."""
import types

import pytest

pytest.importorskip("ipywidgets")

from notebook_launch.display import widget as widget_module
from notebook_launch.display.widget import MESSAGES_PER_SECOND, WidgetDisplay
from notebook_launch.state import DONE, FAILED, RankState, RunState
from panel_helpers import recording_comms


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def monotonic(self):
        return self.now


def run_fast_ranks(monkeypatch, world=8, seconds=10.0, step=0.001, steps_per_tick=500):
    clock = FakeClock()
    monkeypatch.setattr(widget_module, "time", types.SimpleNamespace(monotonic=clock.monotonic))
    sent = recording_comms(monkeypatch, clock=clock.monotonic)
    state = RunState(run_id="t", world_size=world, backend="fork", log_dir="/tmp/x",
                     ranks=[RankState(rank=i, local_rank=i) for i in range(world)])
    display = WidgetDisplay(print_lines=False, poll_kernel=False)
    display.start(state)
    opened = len(sent)
    total = int(seconds / step) * steps_per_tick
    n = 0
    while clock.now < 1000.0 + seconds:
        clock.now += step
        n += steps_per_tick
        for local in range(world):   # every rank reports on every tick: far above 10/s
            state.on_progress(local, {"bars": {"b0": {"desc": "train", "n": n, "total": total}},
                                      "metrics": {"loss": 1.0 / n}})
            state.on_line(local, "stdout", f"step {n}")
        display.refresh(state)
    for local in range(world):
        state.on_progress(local, {"bars": {"b0": {"n": total, "closed": True}}})
        state.on_exit(local, DONE if local != 3 else FAILED, "finished",
                      error="ValueError: boom" if local == 3 else None)
    display.close(state)
    return display, sent[opened:], state, total


def max_per_window(times, window=1.0):
    times = sorted(times)
    best, start = 0, 0
    for end, t in enumerate(times):
        while t - times[start] >= window:
            start += 1
        best = max(best, end - start + 1)
    return best


def test_comm_messages_per_second_stay_bounded_for_8_fast_ranks(monkeypatch):
    display, sent, state, total = run_fast_ranks(monkeypatch)
    updates = [m for m in sent if m["type"] == "comm_msg"]
    running = [m["time"] for m in updates if m["time"] < 1010.0]
    assert display.redraws >= 10                                # it did redraw while running
    assert max_per_window(running) <= MESSAGES_PER_SECOND <= 60
    assert display.redraws <= 10 * 5 + 2                        # <= 5 redraws a second
    # every message that carries trait changes is one widget's batched update (hold_sync)
    assert all(m["data"].get("method") in ("update", "echo_update") for m in updates)


def test_final_state_is_exact(monkeypatch):
    display, sent, state, total = run_fast_ranks(monkeypatch, seconds=1.0)
    for rs, (row, label, bar, info) in zip(state.ranks, display.rows):
        assert bar.value == 1.0
        if rs.rank == 3:
            assert bar.bar_style == "danger" and "ValueError: boom" in info.value
            assert "nl-status-failed" in row._dom_classes
        else:
            assert bar.bar_style == "success" and "nl-status-done" in row._dom_classes
    # and the frontend was told: the last value each bar's comm carried is 1.0
    last_value = {}
    for m in sent:
        state_update = m["data"].get("state", {})
        if "value" in state_update and isinstance(state_update["value"], float):
            last_value[m["comm_id"]] = state_update["value"]
    for _, _, bar, _ in display.rows:
        assert last_value[bar.model_id] == 1.0


def test_text_repr_is_a_meaningful_summary(monkeypatch):
    display, sent, state, total = run_fast_ranks(monkeypatch, world=2, seconds=0.5)
    text = repr(display.panel)
    assert "rank 0 [cpu] done" in text and "train: 100%" in text and "logs: /tmp/x" in text
