"""Per-iteration cost of notebook_launch.progress() next to tqdm and a bare loop.

Run: python benchmarks/progress_cost.py [iterations]   (default 10**6)
Prints a markdown table. "in a rank" means the event channel is installed, as in
a launched rank (events go to /dev/null instead of a parent), so batching, the
flusher thread and the pickling of events are all included. Reports, never asserts.
"""
from __future__ import annotations

import importlib
import io
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from notebook_launch.wire import protocol as channel  # noqa: E402

progress_module = importlib.import_module("notebook_launch.rank.reports.progress")
progress = progress_module.progress


def best_of(runs, loop, n):
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        loop(n)
        times.append(time.perf_counter() - started)
    return min(times)


def bare(n):
    for _ in range(n):
        pass


def with_progress(n):
    for _ in progress(range(n), desc="bench"):
        pass


def with_progress_update(n):
    bar = progress(total=n, desc="bench")
    for _ in range(n):
        bar.update(1)
    bar.close()


def with_tqdm(n):
    from tqdm import tqdm
    for _ in tqdm(range(n), file=io.StringIO(), mininterval=0.1):
        pass


def with_tqdm_update(n):
    from tqdm import tqdm
    bar = tqdm(total=n, file=io.StringIO(), mininterval=0.1)
    for _ in range(n):
        bar.update(1)
    bar.close()


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 10 ** 6
    runs = 5
    rows = [("bare loop", "-", best_of(runs, bare, n))]
    rows.append(("progress() outside a launch (pass-through)", "-", best_of(runs, with_progress, n)))
    have_tqdm = importlib.util.find_spec("tqdm") is not None
    if have_tqdm:
        rows.append(("tqdm (std, output discarded)", "-", best_of(runs, with_tqdm, n)))
        rows.append(("tqdm.update(1) manual", "-", best_of(runs, with_tqdm_update, n)))
    writer = channel.EventWriter(os.open(os.devnull, os.O_WRONLY))
    channel.install(writer)
    try:
        rows.append(("progress() in a rank", "-", best_of(runs, with_progress, n)))
        rows.append(("progress.update(1) manual, in a rank", "-", best_of(runs, with_progress_update, n)))
        sends_before = progress_module.reporter().sends
        started = time.perf_counter()
        with_progress(10 * n)   # long enough for the send rate to mean something
        elapsed = time.perf_counter() - started
        progress_module.flush()
        sends = progress_module.reporter().sends - sends_before
        if have_tqdm:
            from notebook_launch.rank.integrations import tqdm_bridge
            tqdm_bridge.install()
            rows.append(("tqdm in a rank (bridged to the panel)", "-", best_of(runs, with_tqdm, n)))
    finally:
        channel.install(None)
    base = rows[0][2]
    print(f"{n:,} iterations, best of {runs} runs, Python {sys.version.split()[0]}\n")
    print("| loop | total s | ns / iteration | overhead ns / iteration |")
    print("| --- | ---: | ---: | ---: |")
    for name, _, seconds in rows:
        per = seconds / n * 1e9
        print(f"| {name} | {seconds:.3f} | {per:.1f} | {per - base / n * 1e9:.1f} |")
    print(f"\nEvents sent to the parent by one in-rank progress() loop of {10 * n:,} steps: "
          f"{sends} in {elapsed:.2f} s ({sends / max(elapsed, 1e-9):.1f}/s; the cap is "
          f"{progress_module.MAX_SENDS_PER_SECOND}/s, plus the first and final sends).")


if __name__ == "__main__":
    main()
