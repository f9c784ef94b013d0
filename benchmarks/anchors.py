"""Item 15: Meta's Monarch beside persistent ranks, torchrunx beside launches (issue 45).

Rows:
- warm call on 2 persistent ranks: ours (``start_ranks(2)``, then ``ranks.run(f)``) against
  Monarch (``torchmonarch`` 0.7.0: an actor on each of 2 procs of ``this_host().spawn_procs``,
  ``actors.f.call().get()``), median with p10 and p90;
- start to the first call, the same two (imports done before the clock starts);
- a warm trivial launch on 4 and 8 ranks: ours (``notebook_launcher``) against torch's bare
  ``start_processes(start_method="fork")`` and torchrunx 0.4.0 (``Launcher.run``: a launch
  that returns every rank's value).

The function is a notebook's: defined in ``__main__`` (cloudpickled by value, as a notebook
cell's is), not imported from a module as item 7's once was (a function pickled by reference
made a call look 5x cheaper than a user's). Each repeat starts a fresh 'ours' worker and a fresh
Monarch process, in an order that rotates, so each gives one start-to-first-call sample; then
both make CALLS warm calls in alternating blocks of BLOCK (``persistent_repeat`` says why).
Monarch and torchrunx run in their own venvs beside torch 2.13
(``scripts/setup-anchors.sh``); where one is missing the row says so.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

from .common import REPO_ROOT
from .table import Cell, Row, fmt_ratio, ratio
from .worker import Worker, WorkerError

CALLS = 100
# warm calls of one side before the other's, within a repeat: a block's first call comes after the
# process sat idle through the other side's block, and took 2-3x a warm call (caches gone cold), on
# both sides; with blocks of 10 those were a tenth of the samples, just what a p90 reads
BLOCK = 25
DDP_STEPS, DDP_BLOCK = 30, 5   # DDP steps a side per repeat, and a side's turn
DDP_WIDTH = 256           # the kept model: an MLP of 3 hidden layers this wide (anchor_probe.DDP_CELL)
GOAL_VS_MONARCH = 0.5     # ours' warm median at most this share of Monarch's, and start to first call
GOAL_TAIL = 2.0           # ours' p90 at most this many times ours' median
GOAL_LAUNCH = {4: 1.2, 8: 1.3}   # ours / start_processes (fork), warm launch
PROBE_TIMEOUT = 900
# ``os`` imported inside: ipyparallel runs a __main__ function against its engines' namespace, where a
# cell's imports are not (a user would run ``%px import os`` first)
NOTEBOOK_CELL = "def trivial():\n    import os\n    return int(os.environ.get('RANK', '0'))\n"


def venv_python(name: str) -> str | None:
    path = os.path.join(REPO_ROOT, f".venv-{name}", "bin", "python")
    return path if os.access(path, os.X_OK) else None


def notebook_function():
    """``trivial`` defined in ``__main__``, as a notebook cell defines it."""
    main = sys.modules["__main__"]
    exec(compile(NOTEBOOK_CELL, "<notebook cell>", "exec"), main.__dict__)
    return main.__dict__["trivial"]


# --- in the 'ours' worker ------------------------------------------------------------------

_open_ranks: list = []   # the worker's persistent ranks and function, between its commands


def in_worker(op: str, command: dict) -> dict:
    """The 'ours' side of the persistent rows, one command at a time: ``anchor_persistent_open``
    (start to the first call), ``anchor_persistent_calls`` (that many warm calls), and
    ``anchor_persistent_close``, so that the harness can alternate blocks with Monarch's."""
    import time

    if op == "anchor_persistent_open":
        from notebook_launch import start_ranks
        fn = notebook_function()
        started = time.perf_counter()
        ranks = start_ranks(2)
        _open_ranks.append((ranks, fn))
        values = ranks.run(fn)
        return {"start_to_first": time.perf_counter() - started, "values": values}
    if op == "anchor_persistent_ddp_setup":
        from .anchor_probe import DDP_CELL
        ranks, _ = _open_ranks[-1]
        main = sys.modules["__main__"]
        exec(compile(DDP_CELL, "<notebook cell>", "exec"), main.__dict__)
        return {"ranks": sorted(ranks.run(main.__dict__["ddp_setup"], args=(command["width"],)))}
    if op == "anchor_persistent_calls":
        ranks, fn = _open_ranks[-1]
        if command.get("what") == "ddp":
            fn = sys.modules["__main__"].__dict__["ddp_step"]
        samples = []
        for _ in range(command["calls"]):
            began = time.perf_counter()
            ranks.run(fn)
            samples.append(time.perf_counter() - began)
        return {"warm": samples}
    if op == "anchor_persistent_close":
        while _open_ranks:
            _open_ranks.pop()[0].close()
        return {}
    raise ValueError(f"unknown op {op!r}")


# --- in the harness ----------------------------------------------------------------------

def probe(anchor: str, *args: object, log_dir: str) -> dict:
    python = venv_python(anchor)
    if python is None:
        raise FileNotFoundError(f".venv-{anchor} is missing: run `bash scripts/setup-anchors.sh {anchor}`")
    env = dict(os.environ, PYTHONPATH=REPO_ROOT, TORCHRUNX_LOG_DIR=os.path.join(log_dir, "torchrunx"))
    with open(os.path.join(log_dir, f"{anchor}.stderr"), "ab") as errors:
        done = subprocess.run([python, "-m", "benchmarks.anchor_probe", anchor, *map(str, args)], cwd=REPO_ROOT,
                              env=env, stdout=subprocess.PIPE, stderr=errors, timeout=PROBE_TIMEOUT)
    lines = done.stdout.decode(errors="replace").strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{anchor} probe exited {done.returncode}; see {errors.name}")
    return json.loads(lines[-1])


class Side:
    """One side of the persistent rows, held open for a repeat: ours (a worker of this venv) or
    Monarch (its probe in .venv-monarch), each in a fresh process."""

    def __init__(self, name: str, log_dir: str):
        self.name = name
        python = sys.executable if name == "ours" else venv_python(name)
        if python is None:
            raise FileNotFoundError(f".venv-{name} is missing: run `bash scripts/setup-anchors.sh {name}`")
        self.worker = Worker(name, log_dir=log_dir,
                             argv=None if name == "ours" else [python, "-m", "benchmarks.anchor_probe", name])
        try:
            self.start = (self.worker.ask(op="anchor_persistent_open") if name == "ours"
                          else self.worker.wait_ready())
        except BaseException:
            self.worker.close()
            raise

    def calls(self, count: int, what: str = "trivial") -> list:
        return self.worker.ask(op="anchor_persistent_calls" if self.name == "ours" else "calls",
                               calls=count, what=what)["warm"]

    def ddp_setup(self, width: int) -> list:
        return self.worker.ask(op="anchor_persistent_ddp_setup" if self.name == "ours" else "ddp_setup",
                               width=width)["ranks"]

    def close(self) -> None:
        try:
            if self.name == "ours" and self.worker.proc.poll() is None:
                self.worker.ask(op="anchor_persistent_close")
        except WorkerError:
            pass   # what failed is already in the row; the process is ended below either way
        finally:
            self.worker.close()


def persistent_repeat(order: list, calls: int, log_dir: str, found: dict, errors: dict) -> None:
    """One repeat: both sides started (one start-to-first-call sample each), then their warm calls
    in alternating blocks of BLOCK, then a DDP model built in each side's ranks and DDP_STEPS of
    its training steps in alternating blocks of DDP_BLOCK. This VM's speed moves in phases of a
    tenth of a second to a second; 100 calls of one side and then 100 of the other fell in
    different phases and the phases, not the code, decided the ratio (0.43x-0.60x for the same
    code). Blocks of a few milliseconds put both sides in the same phases. Neither side uses the
    CPU while it waits (measured: an idle Monarch or ours takes no clock tick in 3 s)."""
    sides: dict = {}
    try:
        for name in order:
            try:
                sides[name] = Side(name, log_dir)
                found[name]["start"].append(sides[name].start["start_to_first"])
            except (WorkerError, OSError, RuntimeError, ValueError) as exc:
                errors[name] = f"{type(exc).__name__}: {exc}"[:300]
        alternate(order, calls, BLOCK, lambda name, count: sides[name].calls(count), "warm", sides, found, errors)
        for name in order:
            if name in sides and name not in errors:
                try:
                    if sides[name].ddp_setup(DDP_WIDTH) != [0, 1]:
                        errors[f"{name} ddp"] = "the DDP set-up did not return ranks [0, 1]"
                except (WorkerError, OSError, ValueError) as exc:
                    errors[f"{name} ddp"] = f"{type(exc).__name__}: {exc}"[:300]
        alternate(order, DDP_STEPS, DDP_BLOCK, lambda name, count: sides[name].calls(count, "ddp"), "ddp",
                  sides, found, errors)
    finally:
        for side in sides.values():
            side.close()


def alternate(order: list, calls: int, block: int, make_calls, kind: str, sides: dict, found: dict,
              errors: dict) -> None:
    """``calls`` calls a side (``make_calls(name, count)``: their times) in blocks of ``block``,
    the sides taking turns, the first of each pair changing every block; into ``found[name][kind]``.
    A side that failed (``errors``: its name, or its name and ``kind``) makes no more."""
    for start in range(0, calls, block):
        for name in (order if (start // block) % 2 == 0 else order[::-1]):
            failed = name in errors or (kind != "warm" and f"{name} {kind}" in errors)
            if name in sides and not failed:
                try:
                    samples = make_calls(name, min(block, calls - start))
                    found[name][kind] += samples
                    found[name].setdefault(f"{kind} first", []).extend(samples[:1])
                except (WorkerError, OSError, ValueError) as exc:
                    errors[name if kind == "warm" else f"{name} {kind}"] = f"{type(exc).__name__}: {exc}"[:300]


def run(config: dict, log_dir: str, say) -> list:
    calls = 20 if config["quick"] else CALLS
    say(f"item 15: persistent ranks vs Monarch ({config['repeats']} x {calls} calls), launches vs torchrunx")
    found: dict = {name: {"start": [], "warm": [], "ddp": []} for name in ("ours", "monarch")}
    errors: dict = {}
    for repeat in range(config["repeats"]):
        order = [name for name in (["ours", "monarch"] if repeat % 2 == 0 else ["monarch", "ours"])
                 if name not in errors]
        persistent_repeat(order, calls, log_dir, found, errors)
    rows = [call_row(found, errors)]
    from . import anchor_kernels   # the same call made from a notebook's cell
    rows.append(anchor_kernels.run(config["repeats"], calls, log_dir))
    rows += [start_row(found, errors), ddp_row(found, errors)]
    for ranks in ([4] if config["quick"] else [4, 8]):
        rows.append(launch_row(ranks, config, log_dir))
    rows.append(anchor_kernels.launch_row(config["repeats"], 10 if config["quick"] else 4 * BLOCK, log_dir))
    return rows


def percentile(samples: list, share: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def spread(samples: list) -> str:
    return (f"p10 {percentile(samples, 0.1) * 1000:.2f} ms, median {percentile(samples, 0.5) * 1000:.2f} ms, "
            f"p90 {percentile(samples, 0.9) * 1000:.2f} ms")


def call_row(found: dict, errors: dict) -> Row:
    row = Row(item="15", measurement="warm trivial call on 2 persistent ranks, the function a notebook's "
              "(`__main__`): `ranks.run(f)` vs Monarch 0.7.0 `actors.f.call().get()` (an actor on each of 2 "
              "procs)", ranks="2", unit="s", group=15,
              goal=f"median <= {GOAL_VS_MONARCH:g}x Monarch's; p90 <= {GOAL_TAIL:g}x our median")
    ours, monarch = row.cell("ours"), Cell(label="Monarch")
    row.cells["other"] = [monarch]
    for cell, name in ((ours, "ours"), (monarch, "monarch")):
        cell.samples = found[name]["warm"]
        if name in errors:
            cell.text = f"error: {errors[name]}"
    if not ours.samples or not monarch.samples:
        row.met = "unknown (error)"
        return row
    vs = ratio(ours.median(), monarch.median())
    tail = ratio(percentile(ours.samples, 0.9), ours.median())
    first = [percentile(found[name].get("warm first") or [0.0], 0.5) * 1000 for name in ("ours", "monarch")]
    row.ratios = (f"ours/Monarch {fmt_ratio(vs)}; ours p90/median {fmt_ratio(tail)}; ours {spread(ours.samples)}; "
                  f"Monarch {spread(monarch.samples)}; a block's first call (after the other side's block): "
                  f"ours {first[0]:.2f} ms, Monarch {first[1]:.2f} ms")
    row.met = "yes" if vs is not None and vs <= GOAL_VS_MONARCH and tail is not None and tail <= GOAL_TAIL \
        else "**NO (missed)**"
    return row


def ddp_row(found: dict, errors: dict) -> Row:
    """A training step of a DDP model kept in the ranks, each step a new call: what a warm call
    costs beside real work (issue 45 asks for it shown beside Monarch; it has no goal of its own)."""
    row = Row(item="15", measurement=f"a DDP step (gloo, an MLP {DDP_WIDTH} wide, batch 256) on a model kept "
              "in 2 persistent ranks, each step a new call: `ranks.run(step)` vs Monarch `actors.step.call()"
              ".get()` (the model built in each actor)", ranks="2", unit="s", group=15,
              goal="— (shown beside Monarch)")
    beside_monarch(row, {name: found[name]["ddp"] for name in found},
                   {name: errors.get(name) or errors.get(f"{name} ddp") for name in found})
    return row


def beside_monarch(row: Row, samples: dict, errors: dict, goal: float | None = None) -> float | None:
    """Fill ``row``'s two cells, ours and Monarch's (``samples`` and ``errors`` by side's name),
    its ratio of medians and, with a ``goal`` (ours/Monarch at most), whether it is met."""
    return beside_anchor(row, samples, errors, ("ours", "monarch"), "Monarch", goal)


def beside_anchor(row: Row, samples: dict, errors: dict, sides: tuple[str, str], label: str,
                  goal: float | None = None) -> float | None:
    """``beside_monarch`` for any two sides: ``sides`` names ours and the anchor in ``samples`` and
    ``errors``, ``label`` the anchor in the table."""
    ours, anchor = row.cell("ours"), Cell(label=label)
    row.cells["other"] = [anchor]
    for cell, name in ((ours, sides[0]), (anchor, sides[1])):
        cell.samples = samples[name]
        if errors.get(name):
            cell.text = f"error: {errors[name]}"
    vs = ratio(ours.median(), anchor.median())
    row.ratios = f"ours/{label.split(' ')[0]} {fmt_ratio(vs)}"
    if goal is not None:
        row.met = "unknown (error)" if vs is None else ("yes" if vs <= goal else "**NO (missed)**")
    return vs


def start_row(found: dict, errors: dict) -> Row:
    row = Row(item="15", measurement="start to the first call on 2 persistent ranks (imports done): "
              "`start_ranks(2)` + `run(f)` vs Monarch `spawn_procs` + `spawn` + `call().get()`", ranks="2",
              unit="s", group=15, goal=f"<= {GOAL_VS_MONARCH:g}x Monarch's")
    beside_monarch(row, {name: found[name]["start"] for name in found}, errors, GOAL_VS_MONARCH)
    return row


def launch_row(ranks: int, config: dict, log_dir: str) -> Row:
    goal = GOAL_LAUNCH.get(ranks, 1.3)
    row = Row(item="15", measurement=f"warm trivial launch returning every rank's value, {ranks} ranks: "
              "`notebook_launcher` vs `start_processes(fork)` vs torchrunx 0.4.0 `Launcher.run` "
              "(its own venv and process, its launches one after the other)", ranks=str(ranks), unit="s",
              group=15, goal=f"ours <= {goal:g}x start_processes")
    workers = {name: Worker(name, log_dir=log_dir) for name in ("ours", "start_processes")}
    try:
        for worker in workers.values():
            worker.ask(op="time", workload="trivial", ranks=ranks)   # warm-up
        for repeat in range(config["repeats"]):
            for name in (list(workers) if repeat % 2 == 0 else list(reversed(workers))):
                reply = workers[name].ask(op="time", workload="trivial", ranks=ranks)
                row.cell(name).samples.append(reply["seconds"])
    except WorkerError as exc:
        row.cell("ours").text = f"error: {exc}"
    finally:
        for worker in workers.values():
            worker.close()
    runx = Cell(label="torchrunx")
    row.cells["other"] = [runx]
    try:
        reply = probe("torchrunx", ranks, min(3, config["repeats"]), log_dir=log_dir)
        runx.samples = reply["launch"]
        if reply["values"] != list(range(ranks)):
            runx.text = f"wrong values: {reply['values']}"
    except (OSError, RuntimeError, subprocess.TimeoutExpired, ValueError) as exc:
        runx.text = f"not available: {type(exc).__name__}: {exc}"[:300]
    vs = ratio(row.median("ours"), row.median("start_processes"))
    row.ratios = (f"ours/start_processes {fmt_ratio(vs)}; "
                  f"torchrunx/ours {fmt_ratio(ratio(runx.median(), row.median('ours')))}")
    row.met = "unknown (error)" if vs is None else ("yes" if vs <= goal else "**NO (missed)**")
    return row


NOTE = ("Item 15 (benchmarks/anchors.py): Monarch (torchmonarch 0.7.0) and torchrunx (0.4.0) run in their own "
        "venvs beside torch 2.13 (`bash scripts/setup-anchors.sh`), each from a script that imported it before "
        "the clock starts. Persistent rows: each repeat starts a fresh 'ours' worker and a fresh Monarch process "
        f"(order rotating), one start-to-first-call sample each, then {CALLS} warm calls each in alternating "
        f"blocks of {BLOCK} (this VM's speed moves in phases of 0.1-1 s; a block's first call, after the process "
        "sat idle through the other's block, is 2-3x a warm one on both sides: its median is shown apart), "
        f"then {DDP_STEPS} DDP steps each on a "
        f"model built in each rank, in blocks of {DDP_BLOCK} (Monarch's actors set torch's threads as our ranks "
        "do, the cores shared among the ranks: as shipped each proc keeps one per core, and 2 procs x 2 "
        "threads on 2 cores made a step 7-10x slower here); the functions are a "
        "notebook's (`__main__`). The kernel row makes the same call from a Jupyter kernel's cells, a kernel of "
        f"each side's venv, cells of {BLOCK} calls taking turns (benchmarks/anchor_kernels.py). Launch rows: ours and "
        "start_processes interleaved in their workers as item 1; "
        "torchrunx's launches one after the other in its own process after one warm-up (at most 3). The SLURM "
        "side (Monarch's SlurmJob against our SlurmCluster across two nodes) has its own command, "
        "`python -m benchmarks.monarch_slurm --repeats 5`: benchmarks/RESULTS-anchors-slurm.md.")
