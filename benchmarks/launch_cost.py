"""Items 1, 2 and 6: launcher cost, call to return, for a trivial function and
for the first trained step, at several rank counts, against the anchors.

Two conditions, reported as separate rows:
- warm process: each launcher runs in its own long-lived Python process, gets
  one untimed warm-up call, then the timed calls (steady state in a notebook
  that has launched before);
- fresh process: every sample is the first launch in a brand-new Python process
  that has imported torch and the launcher (what the first launch in a
  freshly started notebook kernel pays, including one-time imports).
Within each repeat the launchers take turns, in an order that rotates each
repeat, so drift on the machine affects all of them alike.
"""
from __future__ import annotations

import compileall
import os

from .launchers import LAUNCHERS, PLOT_LABELS
from .table import Cell, Row, fmt_ratio, ratio
from .worker import Worker, WorkerError

MEASUREMENTS = {
    "trivial": "trivial function (returns at once), call to return",
    "first_step": "time to the first trained step (gloo init, DDP, 1 forward/backward/step)",
}


def rotated(names, shift):
    names = list(names)
    shift %= len(names)
    return names[shift:] + names[:shift]


def _record(cells, name, reply):
    if "not_available" in reply:
        cells[name] = Cell(text=f"not available: {reply['not_available']}")
    else:
        cells[name].samples.append(reply["seconds"])


def measure_warm(workers, workload, ranks, repeats, warm_ups=1):
    """``warm_ups`` untimed warm-up calls per launcher (one; none in quick mode, whose numbers are not
    quoted: each spawn-class warm-up starts Pythons that import torch), then ``repeats`` timed rounds."""
    cells = {name: Cell() for name in workers}
    for name, worker in workers.items():
        try:
            for _ in range(warm_ups):
                worker.ask(op="time", workload=workload, ranks=ranks)
        except WorkerError as exc:
            cells[name] = Cell(text=f"error: {exc}")
    for repeat in range(repeats):
        for name in rotated(workers, repeat):
            if cells[name].text:
                continue
            try:
                _record(cells, name, workers[name].ask(op="time", workload=workload, ranks=ranks))
            except WorkerError as exc:
                cells[name] = Cell(text=f"error: {exc}")
    return cells


FLOOR = "floor"   # first-step rows: `import torch._dynamo` alone in a fresh process


def compile_package() -> None:
    """This project's modules compiled to bytecode before the fresh-process rows, as an installed
    package's are (pip compiles them; the anchors' are): a checkout whose environment sets
    PYTHONDONTWRITEBYTECODE (or whose files just changed) otherwise has every fresh process compile
    the modules a first launch imports from source, which once read as 10 ms more of ours."""
    import notebook_launch
    compileall.compile_dir(os.path.dirname(notebook_launch.__file__), quiet=1)


def measure_fresh(launchers, workload, ranks, repeats, log_dir):
    """Every sample: a new interpreter, imports done, then the first launch. For the first
    step, also the floor: the same fresh process importing torch._dynamo (and DDP's module)
    and nothing else, which every training rank needs once (DDP and the optimizers import it)
    and no launcher can skip: this project pays it once in the parent, Accelerate in every rank."""
    compile_package()
    names = list(launchers) + ([FLOOR] if workload == "first_step" else [])
    cells = {name: Cell() for name in names}
    for repeat in range(repeats):
        for name in rotated(names, repeat):
            if cells[name].text:
                continue
            worker = Worker("ours" if name == FLOOR else name, log_dir=log_dir)
            try:
                worker.wait_ready()
                command = {"op": "import_dynamo"} if name == FLOOR else {
                    "op": "time", "workload": workload, "ranks": ranks}
                _record(cells, name, worker.ask(**command))
            except WorkerError as exc:
                cells[name] = Cell(text=f"error: {exc}")
            finally:
                worker.close()
    return cells


def start_workers(launchers, log_dir):
    workers = {name: Worker(name, log_dir=log_dir) for name in launchers}
    for worker in workers.values():
        worker.wait_ready()
    return workers


def close_workers(workers):
    for worker in workers.values():
        worker.close()


def make_row(workload, condition, ranks, cells, goal_item):
    label = MEASUREMENTS[workload] + (", warm process" if condition == "warm"
                                      else ", first launch in a fresh Python process")
    cells = dict(cells)
    floor = cells.pop(FLOOR, None)
    row = Row(item=goal_item or "6", measurement=label, ranks=str(ranks), unit="s", cells=cells,
              group=0 if workload == "trivial" else 1, condition=condition)
    for name in LAUNCHERS:
        row.cells.setdefault(name, Cell(text="not measured"))
    ours = row.median("ours")
    vs_accelerate = ratio(row.median("accelerate"), ours)
    vs_start = ratio(ours, row.median("start_processes"))
    vs_elastic = ratio(row.median("elastic"), ours)
    row.ratios = (f"Accelerate/ours {fmt_ratio(vs_accelerate)}; ours/start_processes {fmt_ratio(vs_start)}; "
                  f"elastic/ours {fmt_ratio(vs_elastic)}")
    if condition == "warm":   # the curves against rank count (benchmarks/plots.py)
        row.curve, row.x, row.x_tick = ("launch_cost" if workload == "trivial" else "first_step"), ranks, str(ranks)
        row.series = {label: row.cells[name] for name, label in PLOT_LABELS.items()}
    if floor is not None:
        floor.label = "floor: `import torch._dynamo` alone, fresh process"
        row.cells["other"] = [floor]
        row.ratios += (f"; ours/floor {fmt_ratio(ratio(ours, floor.median()))}; "
                       f"Accelerate/floor {fmt_ratio(ratio(row.median('accelerate'), floor.median()))}")
    if goal_item == "1" and condition == "fresh":   # issue 12: the first launch in a fresh kernel
        row.goal = "Accelerate/ours ≥ 1x"
        row.met = _met(vs_accelerate is not None and vs_accelerate >= 1, known=vs_accelerate)
    elif goal_item == "1":
        row.goal = "Accelerate/ours ≥ 2x and ours/start_processes ≤ 1.5x"
        row.met = _met(vs_accelerate is not None and vs_accelerate >= 2,
                       vs_start is not None and vs_start <= 1.5, known=vs_accelerate and vs_start)
    elif goal_item == "2" and condition == "fresh":
        row.goal = "Accelerate/ours ≥ 1.5x"
        row.met = _met(vs_accelerate is not None and vs_accelerate >= 1.5, known=vs_accelerate)
    elif goal_item == "2":
        row.goal = "Accelerate/ours ≥ 10x"
        row.met = _met(vs_accelerate is not None and vs_accelerate >= 10, known=vs_accelerate)
    return row


def _met(*conditions, known) -> str:
    if not known:
        return "unknown (a cell is missing)"
    return "yes" if all(conditions) else "**NO (missed)**"


def goal_item_for(workload, ranks, condition):
    if workload == "trivial" and ranks in (2, 4):
        return "1"
    if workload == "first_step" and ranks == 2:
        return "2"
    return None


def run(config, log_dir, say=print):
    """All rows of items 1, 2 and 6, per ``config`` (see run.py)."""
    rows = []
    repeats = config["repeats"]
    # Trivial rows share one worker per launcher across rank counts: the
    # trivial function imports nothing, so nothing leaks between rows.
    if config["trivial_ranks"]:
        say("items 1/6: trivial function, warm processes")
    workers = start_workers(LAUNCHERS, log_dir) if config["trivial_ranks"] else {}
    try:
        for ranks in config["trivial_ranks"]:
            cells = measure_warm(workers, "trivial", ranks, repeats, config.get("warm_ups", 1))
            rows.append(make_row("trivial", "warm", ranks, cells, goal_item_for("trivial", ranks, "warm")))
    finally:
        close_workers(workers)
    for ranks in config["fresh_ranks"] if config.get("fresh_trivial", True) else []:
        say(f"item 1: trivial function, fresh processes, {ranks} ranks")
        cells = measure_fresh(config.get("fresh_launchers", LAUNCHERS), "trivial", ranks, repeats, log_dir)
        rows.append(make_row("trivial", "fresh", ranks, cells, "1"))
    # First-step rows get new workers per row: Accelerate runs a 1-rank launch
    # inside its caller, which would import torch._dynamo into that process.
    for ranks in config["step_ranks"]:
        launchers = config["step_launchers_at"].get(ranks, config["step_launchers"])
        say(f"items 2/6: first trained step, warm processes, {ranks} ranks ({', '.join(launchers)})")
        workers = start_workers(launchers, log_dir)
        try:
            cells = measure_warm(workers, "first_step", ranks, repeats, config.get("warm_ups", 1))
        finally:
            close_workers(workers)
        rows.append(make_row("first_step", "warm", ranks, cells, goal_item_for("first_step", ranks, "warm")))
    for ranks in config["fresh_ranks"] if config.get("fresh_step", True) else []:
        launchers = [name for name in config["step_launchers_at"].get(ranks, config["step_launchers"])
                     if name in config.get("fresh_launchers", LAUNCHERS)]
        say(f"item 2: first trained step, fresh processes, {ranks} ranks")
        cells = measure_fresh(launchers, "first_step", ranks, repeats, log_dir)
        rows.append(make_row("first_step", "fresh", ranks, cells, "2"))
    return rows
