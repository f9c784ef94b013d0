"""Item 3: per-iteration cost of ``notebook_launch.progress`` inside a rank,
against a bare loop and tqdm writing to a null file, in the same rank.

The three loops run in turn, ``repeats`` times each, in one launched rank (the
parent's supervisor is running and receiving the progress events, as in real
use). ``progress`` is used the tqdm way, ``for x in progress(iterable)``; when
this build has no ``notebook_launch.progress`` its column says so.
"""
from __future__ import annotations

import os
import time
from typing import Any, Callable, Iterable

from .table import NOT_AVAILABLE, Cell, Row, fmt_ratio, ratio
from .worker import Worker, WorkerError

LoopWrap = Callable[[Iterable[Any]], Iterable[Any]]  # how a timed loop wraps its range (bare, tqdm, progress)


def loops_in_rank(iterations: int, repeats: int):
    def measure():
        from tqdm import tqdm
        loops: dict[str, LoopWrap | None] = {"bare": lambda it: it, "tqdm": None, "progress": None}
        try:
            from notebook_launch import progress
            loops["progress"] = progress
        except ImportError:
            pass
        samples: dict[str, list[float]] = {name: [] for name in loops}
        unavailable = None if loops["progress"] is not None else "notebook_launch.progress does not exist"
        with open(os.devnull, "w") as null:
            loops["tqdm"] = lambda it: tqdm(it, file=null)
            for _ in range(repeats):
                for name, wrap in loops.items():
                    if wrap is None:
                        continue
                    try:
                        started = time.perf_counter()
                        for _ in wrap(range(iterations)):
                            pass
                        samples[name].append((time.perf_counter() - started) / iterations * 1e9)
                    except Exception as exc:
                        unavailable = f"progress(range(n)) raised {type(exc).__name__}: {exc}"[:200]
                        loops["progress"] = None
        return {"samples": samples, "unavailable": unavailable}
    return measure


def run(config, log_dir, say=print):
    iterations = config["iterations"]
    say(f"item 3: progress() cost, {iterations:,} iterations")
    row = Row(item="3", measurement=f"per-iteration cost over {iterations:,} iterations, inside a rank: "
                                    f"progress() vs bare loop vs tqdm(file=null)",
              ranks="1", unit="ns", goal="progress ≤ tqdm", group=2)
    for name in ("accelerate", "start_processes", "elastic"):
        row.cells[name] = Cell(text="—")
    worker = Worker("ours", log_dir=log_dir)
    try:
        worker.wait_ready()
        reply = worker.ask(op="iteration", iterations=iterations, repeats=config["repeats"])
    except WorkerError as exc:
        row.cells["ours"] = Cell(text=f"error: {exc}")
        return [row]
    finally:
        worker.close()
    samples = reply["samples"]
    row.cells["ours"] = (Cell(samples=samples["progress"]) if samples["progress"]
                         else Cell(text=f"{NOT_AVAILABLE} ({reply['unavailable']})"))
    row.cells["other"] = [Cell(samples=samples["bare"], label="bare loop"),
                          Cell(samples=samples["tqdm"], label="tqdm")]
    progress, tqdm_cost = row.median("ours"), row.cells["other"][1].median()
    row.ratios = f"progress/tqdm {fmt_ratio(ratio(progress, tqdm_cost))}"
    row.met = "unknown (progress not measured)" if progress is None else (
        "yes" if progress <= tqdm_cost else "**NO (missed)**")
    return [row]
