"""The widget panel's traffic to the frontend stays bounded whatever the step rate, and the
panel ends as a picture: its output becomes static HTML of the final state, then every
widget closes.

The widgets are real ipywidgets (7.7 or 8.x, whichever is installed); only the comm under
them is a recording stand-in for the browser (and the display handle one for the output
area), and the clock is simulated so the test does not depend on speed."""
import types

import pytest

pytest.importorskip("ipywidgets")

from notebook_launch.display import widget as widget_module
from notebook_launch.display.widget import MESSAGES_PER_SECOND, WidgetDisplay
from notebook_launch.record.state import DONE, FAILED, RankState, RunState
from helpers.widget_comms import recording_comms


class RecordingHandleStandIn:
    """Stands in for IPython's DisplayHandle of the panel's output: records each update."""

    def __init__(self, sent):
        self.sent = sent

    def update(self, data, raw=False):
        self.sent.append({"time": None, "type": "update_display", "comm_id": None, "data": data})


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def monotonic(self):
        return self.now


def run_fast_ranks(monkeypatch, world=8, seconds=10.0, step=0.001, steps_per_tick=500):
    clock = FakeClock()
    monkeypatch.setattr(widget_module, "time", types.SimpleNamespace(monotonic=clock.monotonic))
    sent = recording_comms(monkeypatch, clock=clock.monotonic)
    monkeypatch.setattr(widget_module, "_show", lambda panel, text: RecordingHandleStandIn(sent))
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


def test_the_run_ends_as_a_picture_of_its_exact_final_state(monkeypatch):
    display, sent, state, total = run_fast_ranks(monkeypatch, seconds=1.0)
    updates = [i for i, m in enumerate(sent) if m["type"] == "update_display"]
    assert len(updates) == 1, [m["type"] for m in sent]
    picture = sent[updates[0]]["data"]
    page = picture["text/html"]
    assert page.count("nl-status-done") == 7 and page.count("nl-status-failed") == 1
    assert page.count("width:100.0%") == 8                       # every bar at its end
    assert f"{total // 1000}k/{total // 1000}k" in page and "ValueError: boom" in page
    assert "Stop" not in page and "<button" not in page            # nothing left to stop
    assert "rank 3 [cpu] failed" in picture["text/plain"]
    # the picture replaces the panel before any widget closes; after it no widget shows anything new:
    # the closing widgets' HTML is only emptied (a notebook saved by nbclient keeps closed models' state)
    first_close = min(i for i, m in enumerate(sent) if m["type"] == "comm_close")
    assert updates[0] < first_close
    after = sent[updates[0] + 1:]
    assert all(m["type"] in ("comm_msg", "comm_close") for m in after)
    emptied = [m["data"]["state"] for m in after if m["type"] == "comm_msg"]
    assert emptied and all(changed == {"value": ""} for changed in emptied), emptied


def test_every_widget_of_the_panel_closes(monkeypatch):
    from ipywidgets.widgets import widget as ipywidgets_widget
    sent = recording_comms(monkeypatch)
    registry = getattr(ipywidgets_widget, "_instances", None)
    if registry is None:   # ipywidgets 7
        registry = ipywidgets_widget.Widget.widgets
    before = set(registry)
    state = RunState(run_id="t", world_size=4, backend="fork", log_dir="/tmp/x",
                     ranks=[RankState(rank=i, local_rank=i) for i in range(4)])
    display = WidgetDisplay(print_lines=False, poll_kernel=False)
    display.start(state)
    opened = {m["comm_id"] for m in sent if m["type"] == "comm_open"}
    assert len(opened) > 4 * 4                                     # rows, bars, their layouts and styles...
    assert opened <= set(registry)
    for local in range(4):
        state.on_exit(local, DONE, "finished")
    display.close(state)
    closed = [m["comm_id"] for m in sent if m["type"] == "comm_close"]
    assert sorted(closed) == sorted(opened)                        # each once
    assert set(registry) == before
    display.refresh(state)                                         # a late refresh sends nothing
    display.close(state)                                           # nor a second close
    assert len(sent) == len(opened) + len([m for m in sent if m["type"] == "comm_msg"]) + len(closed)


def test_text_repr_is_a_meaningful_summary(monkeypatch):
    display, sent, state, total = run_fast_ranks(monkeypatch, world=2, seconds=0.5)
    text = repr(display.panel)
    assert "rank 0 [cpu] done" in text and "train: 100%" in text and "logs: /tmp/x" in text
