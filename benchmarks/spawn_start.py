"""Item 13: launches that must not fork the notebook (a CUDA context in it, ROCm/XPU, TorchTPU,
Python 3.14's forkserver default), side by side in one run: our fork start, our spawn-class start
(ranks forked from the warm start process), our spawn with the start process switched off (every
rank a fresh Python, as before it), torch's ``start_processes(start_method="spawn")`` and torch
elastic's ``elastic_launch`` with ``start_method="spawn"`` (what Accelerate 1.14+ runs on ROCm and
XPU). Trivial function and first DDP step, warm process (each launcher in its own long-lived Python
after one untimed launch) and first launch in a fresh process (for ours, including the wait for
the start process's imports); and the start process's own resident memory.

Goals (issue 41): a warm spawn-class launch within 1.5x of fork (trivial, 2 ranks) and within 2x of
fork to the first DDP step (2 ranks); at least 20x faster than torch's spawn (trivial, 2 ranks); a
first launch in a fresh process never slower than our spawn without the start process.
"""
from __future__ import annotations

from .launch_cost import MEASUREMENTS, close_workers, measure_fresh, measure_warm, start_workers
from .launchers import SPAWN_CLASS
from .table import Cell, Row, fmt_ratio, ratio

LABELS = {
    "ours": "ours, fork",
    "ours_fresh_spawn": "ours, spawn as fresh Pythons (start process off)",
    "mp_spawn": "torch start_processes (spawn)",
    "elastic_spawn": "elastic_launch (spawn)",
}


def make_row(workload: str, condition: str, ranks: int, cells: dict) -> Row:
    label = (MEASUREMENTS[workload] + ", spawn-class start (ours: ranks forked from the warm start process)"
             + (", warm process" if condition == "warm" else ", first launch in a fresh Python process"))
    row = Row(item="13", measurement=label, ranks=str(ranks), unit="s",
              group=0 if workload == "trivial" else 1, condition=condition)
    row.cells["ours"] = cells.get("ours_spawn", Cell(text="not measured"))
    for name in ("accelerate", "start_processes", "elastic"):
        row.cells[name] = Cell(text="see other anchors")
    others = []
    for name, text in LABELS.items():
        cell = cells.get(name)
        if cell is not None:
            cell.label = text
            others.append(cell)
    row.cells["other"] = others
    ours = row.median("ours")
    fork = cells["ours"].median() if "ours" in cells else None
    vs_fork = ratio(ours, fork)
    vs_mp = ratio(cells["mp_spawn"].median() if "mp_spawn" in cells else None, ours)
    vs_elastic = ratio(cells["elastic_spawn"].median() if "elastic_spawn" in cells else None, ours)
    vs_fresh = ratio(cells["ours_fresh_spawn"].median() if "ours_fresh_spawn" in cells else None, ours)
    row.ratios = (f"ours spawn-class/ours fork {fmt_ratio(vs_fork)}; torch spawn/ours {fmt_ratio(vs_mp)}; "
                  f"elastic spawn/ours {fmt_ratio(vs_elastic)}; fresh Pythons/ours {fmt_ratio(vs_fresh)}")
    if condition == "warm" and workload == "trivial" and ranks == 2:
        row.goal = "ours/fork ≤ 1.5x and torch spawn/ours ≥ 20x"
        row.met = _met(vs_fork is not None and vs_fork <= 1.5, vs_mp is not None and vs_mp >= 20,
                       known=vs_fork and vs_mp)
    elif condition == "warm" and workload == "first_step" and ranks == 2:
        row.goal = "ours/fork ≤ 2x"
        row.met = _met(vs_fork is not None and vs_fork <= 2, known=vs_fork)
    elif condition == "fresh":
        row.goal = "fresh Pythons/ours ≥ 1x"
        row.met = _met(vs_fresh is not None and vs_fresh >= 1, known=vs_fresh)
    else:
        row.goal = "— (reported)"
    return row


def _met(*conditions, known) -> str:
    if not known:
        return "unknown (a cell is missing)"
    return "yes" if all(conditions) else "**NO (missed)**"


def start_process_memory(workers) -> Cell:
    """The start process's resident memory, read by the ``ours_spawn`` worker (its notebook)."""
    try:
        reply = workers["ours_spawn"].ask(op="start_process_memory")
    except Exception as exc:   # why: a row that says why it is missing, not a failed run
        return Cell(text=f"error: {exc}")
    return Cell(samples=[reply["bytes"] / 1e6])


def run(config, log_dir, say=print):
    rows = []
    repeats = config["repeats"]
    for workload in ("trivial", "first_step"):
        # Quick mode (a harness check): every launcher runs in the trivial rows; the first step and the
        # fresh processes for ours only (each launch of the others starts Pythons that import torch).
        launchers = list(SPAWN_CLASS) if workload == "trivial" else config.get("spawn_step_launchers", SPAWN_CLASS)
        for ranks in config["spawn_ranks"]:
            say(f"item 13: {workload}, spawn-class starts, warm processes, {ranks} ranks")
            workers = start_workers(launchers, log_dir)
            try:
                cells = measure_warm(workers, workload, ranks, repeats, config.get("warm_ups", 1))
                if workload == "trivial" and ranks == config["spawn_ranks"][0]:
                    memory = start_process_memory(workers)
            finally:
                close_workers(workers)
            rows.append(make_row(workload, "warm", ranks, cells))
    for workload in config.get("spawn_fresh_workloads", ("trivial", "first_step")):
        say(f"item 13: {workload}, spawn-class starts, fresh processes, 2 ranks")
        cells = measure_fresh(["ours", "ours_spawn", "ours_fresh_spawn"], workload, 2, repeats, log_dir)
        cells.pop("floor", None)
        rows.append(make_row(workload, "fresh", 2, cells))
    rows.append(Row(item="13", measurement="resident memory (RSS) of the warm start process, torch imported",
                    ranks="1", unit="MB", group=4, cells={"ours": memory, "other": []},
                    goal="— (reported)", ratios="—"))
    return rows
