"""Comm messages per second the widget panel sends for 8 ranks stepping fast.

Run: python benchmarks/widget_traffic.py [seconds] [ranks]   (default 5 s, 8 ranks; --quick: 3 s)
Real ipywidgets; a recording comm stands in for the browser and counts what
would go over IOPub. Every rank folds a progress event (with a logged loss,
so the curves are drawn too) and a log line every millisecond (100x what a rank really sends),
the supervisor's refresh() runs every millisecond (100x its real rate). Prints a markdown table; never asserts.
"""
from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def main():
    argv = [a for a in sys.argv[1:] if a != "--quick"]
    seconds = float(argv[0]) if argv else (3.0 if "--quick" in sys.argv else 5.0)
    world = int(argv[1]) if len(argv) > 1 else 8
    result = measure(seconds, world)
    print(f"{world} ranks, {result['elapsed']:.1f} s, {result['events_per_second']:,.0f} progress events/s "
          f"folded, refresh() about every 1 ms\n")
    print("| measure | value |")
    print("| --- | ---: |")
    print(f"| widgets opened (comm_open) | {result['opened']} |")
    print(f"| redraws | {result['redraws']} ({result['redraws'] / result['elapsed']:.1f}/s) |")
    print(f"| comm messages while running | {result['running']} ({result['per_second']:.1f}/s) |")
    print(f"| most comm messages in any 1 s window | {result['window_max']} (budget {result['budget']}) |")
    print(f"| messages at the end (the picture replaces the panel; one comm_close per widget) | {result['final']} |")


def measure(seconds: float = 5.0, world: int = 8) -> dict:
    """Drive a real WidgetDisplay with a recording comm; count what it would send."""
    import comm as comm_module
    from comm.base_comm import BaseComm

    sent = []

    class RecordingComm(BaseComm):
        def publish_msg(self, msg_type, data=None, metadata=None, buffers=None, **keys):
            sent.append((time.monotonic(), msg_type))

    comm_module.create_comm = lambda **kw: RecordingComm(**kw)
    from notebook_launch.display.widget import MESSAGES_PER_SECOND, WidgetDisplay
    from notebook_launch.record.state import DONE, RankState, RunState

    state = RunState(run_id="bench", world_size=world, backend="fork", log_dir="/tmp/bench",
                     ranks=[RankState(rank=i, local_rank=i) for i in range(world)])
    display = WidgetDisplay(print_lines=False, poll_kernel=False)
    import contextlib
    with contextlib.redirect_stdout(open(os.devnull, "w")):
        display.start(state)
    opened = len(sent)
    started = time.monotonic()
    n = events = 0
    while time.monotonic() - started < seconds:
        n += 1000
        for local in range(world):
            state.on_progress(local, {"bars": {"b0": {"desc": "train", "n": n, "total": 10 ** 9}},
                                      "metrics": {"loss": 1.0 / n},
                                      "series": {"loss": [1.0 / n]}})   # the curves redraw too
            state.on_line(local, "stdout", f"step {n}")
            events += 1
        display.refresh(state)
        time.sleep(0.001)
    for local in range(world):
        state.on_exit(local, DONE, "finished")
    close_from = len(sent)
    display.close(state)
    elapsed = time.monotonic() - started
    running = [t for t, kind in sent[opened:close_from] if kind == "comm_msg"]
    per_second: dict[int, int] = {}  # whole seconds since the start -> comm messages sent in it
    for t in running:
        per_second[int(t - started)] = per_second.get(int(t - started), 0) + 1
    window_max, j = 0, 0
    for i, t in enumerate(running):
        while t - running[j] >= 1.0:
            j += 1
        window_max = max(window_max, i - j + 1)
    return {"elapsed": elapsed, "events_per_second": events / elapsed, "opened": opened,
            "redraws": display.redraws, "running": len(running), "per_second": len(running) / elapsed,
            "window_max": window_max, "budget": MESSAGES_PER_SECOND, "final": len(sent) - close_from}


if __name__ == "__main__":
    main()
