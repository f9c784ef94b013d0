"""Item 11: what the hang bookkeeping costs (issue 20 item 5): a DDP training step and a bare
4-byte ``all_reduce``, with and without the whereabouts record (``rank.reports.whereabouts``: every
``torch.distributed`` collective is wrapped to write what it is into a mapped record).

Method: one launch of 2 ranks (gloo, CPU, fork), in a fresh Python process of its own (``python
-m benchmarks.collective_bookkeeping``, which prints one JSON line), so nothing else the harness
ran shares it. Inside the ranks the two ways take turns, block by block, in an order that rotates
every repeat: "with" is the rank as launched (collectives wrapped), "without" has torch's own
collectives put back (``whereabouts.set_recording(dist, False)``), so both ways run in the same
processes on the same process group. Both ranks do the same sequence; rank 0 times it.

- the bare collective: ``COLLECTIVES_PER_BLOCK`` ``dist.all_reduce`` calls on a 1-element
  float32 tensor; a sample is a block's mean per call. Goal: within 5 us per collective.
- the bookkeeping alone: the wrapper around a collective that does nothing (``_recording`` of a
  no-op, with the rank's record) against the no-op itself, ``OVERHEAD_CALLS`` calls a sample:
  what each collective pays, without gloo's noise (a loaded machine moves a 4-byte all_reduce by
  more than the whole bookkeeping costs).
- the pace counters alone (issue 34 item 4: ``rank.reports.pace``, the step rate and waiting share the
  panel shows): the same wrapped no-op with the rank's counters and with them taken out
  (``whereabouts._pace = None``), ``OVERHEAD_CALLS`` calls a sample. Shown as what they add to
  a call against the bare 4-byte all_reduce above, the cheapest collective a step can make:
  goal within ``GOAL_PACE_SHARE`` of it.
- the DDP step: forward, backward (DDP's gradient all-reduce), SGD step of a small MLP on a
  batch of 256, ``STEPS_PER_BLOCK`` steps per block; a sample is a block's mean per step. Goal:
  within 2%. (DDP's reducer all-reduces in C++, not through the wrapped Python functions, so
  the step pays only for what a training loop calls itself.)
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from .table import Cell, Row, fmt_ratio, ratio

COLLECTIVES_PER_BLOCK = 2000
STEPS_PER_BLOCK = 20
OVERHEAD_CALLS = 100_000
GOAL_US = 5.0
GOAL_STEP_RATIO = 1.02
GOAL_PACE_SHARE = 0.02   # what the pace counters add to a collective, against the smallest all_reduce


# --- in the ranks ----------------------------------------------------------------------------

def measure_in_rank(repeats: int, collectives: int, steps: int, width: int, overhead_calls: int) -> dict:
    """Both rows, by turns; rank 0's samples (seconds per collective / per step) by way."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from notebook_launch.rank.reports import whereabouts
    dist.init_process_group("gloo")
    recorded = getattr(dist.all_reduce, "_notebook_launch_wrapped", False)
    torch.manual_seed(0)
    layers = [torch.nn.Linear(width, width), torch.nn.ReLU()] * 3 + [torch.nn.Linear(width, 1)]
    model = DDP(torch.nn.Sequential(*layers))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(256, width), torch.randn(256, 1)
    small = torch.ones(1)

    def step() -> None:
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    def collective_block() -> float:
        started = time.perf_counter()
        for _ in range(collectives):
            dist.all_reduce(small)
        return (time.perf_counter() - started) / collectives

    def nothing(*args: object, **kwargs: object) -> None:
        return None

    recording = whereabouts._recording("all_reduce", nothing)   # the wrapper every collective gets

    def overhead_block(way: str) -> float:
        call = recording if way == "with" else nothing
        started = time.perf_counter()
        for _ in range(overhead_calls):
            call(small)
        return (time.perf_counter() - started) / overhead_calls

    counters = whereabouts._pace

    def pace_block(way: str) -> float:
        whereabouts._pace = counters if way == "with" else None   # the wrapper reads it at each call
        try:
            return overhead_block("with")
        finally:
            whereabouts._pace = counters

    def step_block() -> float:
        started = time.perf_counter()
        for _ in range(steps):
            step()
        return (time.perf_counter() - started) / steps

    samples: dict = {kind: {"with": [], "without": []} for kind in ("collective", "step", "overhead", "pace")}
    for way in ("with", "without"):   # warm-up, untimed
        whereabouts.set_recording(dist, way == "with")
        collective_block()
        step_block()
    for repeat in range(repeats):
        ways = ["with", "without"] if repeat % 2 == 0 else ["without", "with"]
        for way in ways:
            whereabouts.set_recording(dist, way == "with")
            samples["collective"][way].append(collective_block())
            samples["step"][way].append(step_block())
            samples["overhead"][way].append(overhead_block(way))
            samples["pace"][way].append(pace_block(way))
    whereabouts.set_recording(dist, True)
    dist.barrier()
    return {"samples": samples, "recorded": recorded}


def main(argv: list[str]) -> None:
    """The fresh process: launch, print rank 0's samples as one JSON line."""
    repeats, collectives, steps, width, overhead_calls = (int(word) for word in argv)
    from notebook_launch import notebook_launcher

    from .common import free_port
    results = notebook_launcher(measure_in_rank, (repeats, collectives, steps, width, overhead_calls), num_processes=2,
                                use_port=free_port(), ui="none", start_method="fork")
    print(json.dumps(results[0]), flush=True)


# --- in the harness --------------------------------------------------------------------------

def run(config: dict, log_dir: str, say=print) -> list:
    quick = config["quick"]
    repeats = config["repeats"] if quick else max(config["repeats"], 10)   # blocks are short: more of them
    collectives = 200 if quick else COLLECTIVES_PER_BLOCK
    steps = 5 if quick else STEPS_PER_BLOCK
    width = 64 if quick else 512
    overhead_calls = 10_000 if quick else OVERHEAD_CALLS
    say(f"item 11: hang bookkeeping, {repeats} blocks each way of {collectives} all_reduce and {steps} DDP steps")
    collective_row = Row(item="11", measurement=f"bare all_reduce of 4 bytes (gloo, CPU), per call: with the hang "
                                                f"bookkeeping vs without, {collectives} calls a sample",
                         ranks="2", unit="us", goal=f"within {GOAL_US:g} us", group=11)
    step_row = Row(item="11", measurement=f"DDP step (MLP width {width}, batch 256): with the hang bookkeeping "
                                          f"vs without, {steps} steps a sample",
                   ranks="2", unit="s", goal=f"within {round((GOAL_STEP_RATIO - 1) * 100)}%", group=11)
    overhead_row = Row(item="11", measurement=f"the bookkeeping alone: a collective that does nothing, wrapped "
                                              f"vs bare, per call, {overhead_calls:,} calls a sample",
                       ranks="2", unit="us", goal=f"within {GOAL_US:g} us", group=11)
    pace_row = Row(item="11", measurement=f"the pace counters alone (the panel's step rate and waiting share): "
                                          f"the wrapped no-op with vs without them, per call, {overhead_calls:,} "
                                          f"calls a sample",
                   ranks="2", unit="us", goal=f"within {GOAL_PACE_SHARE:.0%} of a 4-byte all_reduce", group=11)
    rows = [collective_row, overhead_row, pace_row, step_row]
    for row in rows:
        for name in ("accelerate", "start_processes", "elastic"):
            row.cells[name] = Cell(text="—")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.abspath(__file__))), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-m", "benchmarks.collective_bookkeeping", str(repeats),
                           str(collectives), str(steps), str(width), str(overhead_calls)],
                          capture_output=True, text=True, env=env, timeout=1800)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        for row in rows:
            row.cells["ours"] = Cell(text=f"error: {(done.stderr or done.stdout)[-300:]}")
        return rows
    reply = json.loads(lines[-1])
    samples = reply["samples"]
    collective = {way: [seconds * 1e6 for seconds in samples["collective"][way]] for way in ("with", "without")}
    collective_row.cells["ours"] = Cell(samples=collective["with"], label="with")
    collective_row.cells["other"] = [Cell(samples=collective["without"], label="without")]
    extra = collective_row.median("ours") - collective_row.cells["other"][0].median()
    collective_row.ratios = f"with − without {extra:+.2f} us"
    collective_row.met = "yes" if extra <= GOAL_US else "**NO (missed)**"
    overhead = {way: [seconds * 1e6 for seconds in samples["overhead"][way]] for way in ("with", "without")}
    overhead_row.cells["ours"] = Cell(samples=overhead["with"], label="wrapped")
    overhead_row.cells["other"] = [Cell(samples=overhead["without"], label="bare")]
    cost = overhead_row.median("ours") - overhead_row.cells["other"][0].median()
    overhead_row.ratios = f"wrapped − bare {cost:+.2f} us"
    overhead_row.met = "yes" if cost <= GOAL_US else "**NO (missed)**"
    pace = {way: [seconds * 1e6 for seconds in samples["pace"][way]] for way in ("with", "without")}
    pace_row.cells["ours"] = Cell(samples=pace["with"], label="with")
    pace_row.cells["other"] = [Cell(samples=pace["without"], label="without")]
    added = pace_row.median("ours") - pace_row.cells["other"][0].median()
    share = ratio(max(added, 0.0), collective_row.cells["other"][0].median())
    pace_row.ratios = f"with − without {added:+.2f} us = {fmt_share(share)} of a bare all_reduce"
    pace_row.met = "unknown" if share is None else ("yes" if share <= GOAL_PACE_SHARE else "**NO (missed)**")
    step_row.cells["ours"] = Cell(samples=samples["step"]["with"], label="with")
    step_row.cells["other"] = [Cell(samples=samples["step"]["without"], label="without")]
    step_ratio = ratio(step_row.median("ours"), step_row.cells["other"][0].median())
    step_row.ratios = f"with/without {fmt_ratio(step_ratio)}"
    step_row.met = "unknown" if step_ratio is None else ("yes" if step_ratio <= GOAL_STEP_RATIO else "**NO (missed)**")
    if not reply.get("recorded"):
        for row in rows:
            row.met = "unknown (the ranks' collectives were not wrapped: NOTEBOOK_LAUNCH_WHEREABOUTS=0?)"
    return rows


def fmt_share(share: float | None) -> str:
    return "n/a" if share is None else f"{share:.1%}"


NOTE = ("Item 11 (benchmarks/collective_bookkeeping.py): one launch of 2 ranks in a fresh process; in the ranks "
        "the two ways take turns block by block (order rotating every repeat), 'without' having torch's own "
        "collectives put back in torch.distributed; rank 0 times. A sample is a block's mean per call or per step.")


if __name__ == "__main__":
    main(sys.argv[1:])
