"""The one benchmark command: measure, in one run on this machine, and write one markdown table.

    .venv/bin/python benchmarks/run.py [--quick] [--repeats N] [--only 1,2,5] [--out benchmarks/RESULTS.md]
                                       [--plots docs/images/benchmarks]

(or ``python -m benchmarks.run``). Every timed cell is the median of N runs
with min and max. --quick shrinks sizes (2 ranks, a 64 MiB tensor, 10^4
iterations, no untimed warm-up launch, a 25 s soak) to check that the harness
works, not to quote. The same run draws the
plots of the docs' benchmark page from the table's rows (benchmarks/plots.py):
launch cost and the first DDP step against rank count (items 1, 2 and 6), result
transfer against size (item 8), the soak's series over time (item 14).
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
import time

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    __package__ = "benchmarks"

from benchmarks import (anchors, collective_bookkeeping, companions, iteration_cost, kernel_first_launch,  # noqa: E402
                        launch_cost, memory, persistent_cost, persistent_ray, ray_cluster, result_transfer,
                        soak, spawn_start)
from benchmarks.common import REPO_ROOT, machine_description  # noqa: E402
from benchmarks.plots import write_plots  # noqa: E402
from benchmarks.table import render_table  # noqa: E402
from benchmarks.worker import READY_STATES  # noqa: E402

# 9 and 12: Ray cluster rows (need root for network namespaces); 11: the hang bookkeeping; 14: the soak
# 15: Monarch beside persistent ranks and torchrunx beside launches, in their venvs (scripts/setup-anchors.sh)
ITEMS = ("1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15")
# Item 14 (benchmarks/soak.py): a compressed day in JupyterLab, and a rank filling its log folder's disk
SOAK_FULL = dict(soak_ranks=8, soak_seconds=360, soak_sample_seconds=10, soak_settle_seconds=60,
                 soak_disk_mb=64, soak_keep_mb=32, soak_log_mb=1000)
# Quick (the smoke test, tests/test_benchmarks_smoke_soak.py): the shortest soak that still has three
# samples after settling (a slope) and a log twice the disk's size (the disk fills, the run returns).
SOAK_QUICK = dict(soak_ranks=2, soak_seconds=25, soak_sample_seconds=5, soak_settle_seconds=10,
                  soak_disk_mb=16, soak_keep_mb=8, soak_log_mb=32)
DEFAULT_OUT = os.path.join(REPO_ROOT, "benchmarks", "RESULTS.md")
DEFAULT_PLOTS = os.path.join(REPO_ROOT, "docs", "images", "benchmarks")


def make_config(quick: bool, repeats: int) -> dict:
    all_launchers = ["ours", "accelerate", "start_processes", "elastic"]
    if quick:   # every item's code runs once, at the smallest sizes; the fresh-process rows for two
        # launchers only (each sample is a new interpreter importing torch; the warm rows run all four)
        return dict(quick=True, repeats=repeats, trivial_ranks=[1, 2], fresh_ranks=[2], step_ranks=[2],
                    step_launchers=["ours", "accelerate", "start_processes"], step_launchers_at={},
                    fresh_launchers=["ours", "accelerate"], tensor_mib=64, memory_ranks=2, iterations=10**4,
                    spawn_ranks=[2], spawn_step_launchers=["ours", "ours_spawn"], spawn_fresh_workloads=["trivial"],
                    warm_ups=0, **SOAK_QUICK)   # no untimed warm-up launch: its numbers are not quoted
    return dict(quick=False, repeats=repeats, trivial_ranks=[1, 2, 4, 8], fresh_ranks=[2],
                fresh_launchers=all_launchers,
                step_ranks=[1, 2, 4, 8], step_launchers=["ours", "accelerate", "start_processes"],
                step_launchers_at={2: all_launchers}, tensor_mib=1024, memory_ranks=2, iterations=10**6,
                spawn_ranks=[2, 4, 8], **SOAK_FULL)


def restrict(config: dict, only: set) -> dict:
    """Drop what the selected items do not need (items 1, 2 and 6 share rows)."""
    config = dict(config)
    if not only & {"1", "6"}:
        config["trivial_ranks"] = []
    elif "6" not in only:
        config["trivial_ranks"] = [r for r in config["trivial_ranks"] if r in (2, 4)]
    if not only & {"2", "6"}:
        config["step_ranks"] = []
    elif "6" not in only:
        config["step_ranks"] = [r for r in config["step_ranks"] if r == 2]
    config["fresh_trivial"] = "1" in only
    config["fresh_step"] = "2" in only
    return config


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, to check the harness works")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per cell (default 5; quote only >= 5)")
    parser.add_argument("--only", default=",".join(ITEMS),
                        help=f"comma-separated items to run, of {','.join(ITEMS)} (default: all)")
    parser.add_argument("--out", default=DEFAULT_OUT, help="markdown file to write (default benchmarks/RESULTS.md)")
    parser.add_argument("--ranks", default="", metavar="N,N",
                        help="only these rank counts in the items that sweep them (default: each item's own)")
    parser.add_argument("--plots", default=DEFAULT_PLOTS, metavar="DIR",
                        help="folder for the SVG plots (default docs/images/benchmarks; '' draws none)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1; got {args.repeats}")
    only = {x.strip() for x in args.only.split(",") if x.strip()}
    if not only or only - set(ITEMS):
        parser.error(f"--only takes items among {','.join(ITEMS)}; got {args.only!r}")
    args.only = only
    try:
        args.ranks = {int(x) for x in args.ranks.split(",") if x.strip()}
    except ValueError:
        parser.error(f"--ranks takes comma-separated rank counts; got {args.ranks!r}")
    if any(n < 1 for n in args.ranks):
        parser.error(f"--ranks takes rank counts of at least 1; got {args.ranks!r}")
    return args


def only_ranks(config: dict, ranks: set) -> dict:
    """Keep only the rank counts asked for (``--ranks``): a quicker rerun of one row of a sweep, e.g.
    item 13's 2-rank goal row without its 8-rank spawns (minutes each)."""
    if not ranks:
        return config
    return {key: [n for n in value if n in ranks] if key.endswith("_ranks") and isinstance(value, list) else value
            for key, value in config.items()}


def measure(config: dict, only: set, log_dir: str, say):
    rows, companion_outputs = [], {}
    if only & {"1", "2", "6"}:
        rows += launch_cost.run(config, log_dir, say)
    if "3" in only:
        rows += iteration_cost.run(config, log_dir, say)
    if "4" in only:
        item4_rows, companion_outputs = companions.run(config, log_dir, say)
        rows += item4_rows
    if "5" in only:
        rows += memory.run(config, log_dir, say)
    if "7" in only:
        rows += persistent_cost.run(config, log_dir, say)
    if "8" in only:
        rows += result_transfer.run(config, log_dir, say)
    if "9" in only:
        rows += ray_cluster.run(config, log_dir, say)
    if "10" in only:
        rows += kernel_first_launch.run(config, log_dir, say)
    if "11" in only:
        rows += collective_bookkeeping.run(config, log_dir, say)
    if "12" in only:
        rows += persistent_ray.run(config, log_dir, say)
    if "13" in only:
        rows += spawn_start.run(config, log_dir, say)
    if "14" in only:
        rows += soak.run(config, log_dir, say)
    if "15" in only:
        rows += anchors.run(config, log_dir, say)
    order = {"fresh": 1, "kernel": 2}   # warm process, fresh process, fresh kernel
    rows.sort(key=lambda r: (r.group, order.get(r.condition, 0), int(r.ranks)))  # stable: fork before spawn
    return rows, companion_outputs


def busy_machine_warning(machine: dict):
    """A load average above the core count means other work shared the CPUs."""
    try:
        load = float(machine["load average at start"].split(",")[0])
        cores = int(machine["cores"].split()[0])
    except (KeyError, ValueError, IndexError):
        return None
    if load <= cores:
        return None
    return (f"**The machine was busy (1-minute load average {load:.1f} on {cores} cores at the start): "
            "these numbers are noisy; rerun on a quiet machine to quote them.**")


def notes(config: dict, elapsed: float) -> list:
    preloaded = sorted({name for name, ready in READY_STATES if ready.get("torch._dynamo imported")})
    lines = [
        f"Each timed cell: median of {config['repeats']} runs (min–max, n). Ratios use medians. "
        "Goals are checked on items 1 and 2 (2 and 4 ranks for item 1, 2 ranks for item 2; the fresh-process "
        "rows have their own goals, issue 12) and item 7; item 6 rows show how cost grows with ranks and "
        "carry no goal.",
        "Every launcher runs the same module-level function, on CPU with fork, from its own Python "
        "process (one per launcher, started fresh for each first-step row) that imported torch and the "
        "launcher before any timing; the harness asks them in turn and the order rotates every repeat, "
        "so drift on the machine affects all launchers alike. fd 1 of every process points at /dev/null.",
        ("Warm process rows: one untimed warm-up call per launcher, then the timed calls. " if config.get(
            "warm_ups", 1) else "Warm process rows (quick mode): no untimed warm-up call, the timed calls only. ")
        + "Fresh process "
        "rows: every sample is the first launch in a new interpreter (no warm-up), which is what the "
        "first launch in a newly started notebook kernel costs, one-time imports included. This project's "
        "modules are compiled to bytecode first, as an installed package's (and the anchors') are.",
        "Why separate processes: this project's fork backend imports torch._dynamo once in the parent "
        "before forking when the launched code looks like training (DDP imports it lazily; forked ranks "
        "then share it; a trivial function does not trigger it). In one shared process "
        "Accelerate's children would inherit that import and skip the 1-4 s each pays in a real notebook. "
        + ("No launcher's process had torch._dynamo imported before its first launch."
           if not preloaded else f"WARNING: torch._dynamo was already imported in: {', '.join(preloaded)}."),
        "The fresh-process first-step row also times the floor: a fresh 'ours' worker (torch and the "
        "launcher imported) importing torch._dynamo and torch.nn.parallel and nothing else, which every "
        "training rank needs once (DDP's constructor and the optimizers import it) and no launcher can "
        "skip after the call. Accelerate/floor is what a launcher costing nothing beyond that import "
        "would reach against Accelerate.",
        "Item 2's function returns without destroy_process_group(): the rank exits right after (every "
        "launcher here ends ranks with os._exit). Destroying the group and then freeing the DDP model can "
        "deadlock inside ~ProcessGroupGloo (seen while building this benchmark).",
        "Every launcher gets a free port per call (use_port / MASTER_PORT / rdzv_endpoint). "
        "This project: `notebook_launcher(fn, num_processes=n, use_port=<free port>)`, other arguments "
        "default (ui='auto', here the text "
        "display to /dev/null; rank logs to a temporary folder). Accelerate 1.15 `notebook_launcher(fn, "
        "num_processes=n, use_port=<free port>)`: prints a line ('Launching training on n CUDAs.' even on "
        "CPU), runs `elastic_launch` with fork, returns None; with 1 process it calls the function in the "
        "calling process. `start_processes(entry, nprocs=n, start_method='fork')`: the entry sets RANK, "
        "WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT (it passes only the index). "
        "`elastic_launch`: the LaunchConfig Accelerate builds (static rendezvous, monitor_interval 0.1, fork).",
        "Item 5: extra per rank = USS of a rank whose function closes over the tensor and sums it "
        "(read-only) minus USS of the same rank index in a launch whose function closes over nothing; "
        "USS (psutil memory_full_info().uss) counts only pages no other process shares, so copy-on-write "
        "pages still shared with the notebook do not count. Measured inside each rank while it runs.",
        "Item 3: the three loops take turns in one launched rank; the parent receives progress events "
        "meanwhile. Item 4: a real WidgetDisplay driven from the run state with every rank folding "
        "a progress event and a log line every millisecond (100x what a rank sends, since ranks batch "
        "to 10 events/s whatever their step rate) and refresh() every millisecond; a recording comm "
        "counts comm messages (benchmarks/widget_traffic.py).",
        "Item 7 (persistent ranks, `start_ranks`): the function is defined in `__main__`, as a notebook "
        "cell's (cloudpickled by value; until issue 45 it was a module's function, pickled by reference, which "
        "made a call look 5x cheaper than a user's); one 'ours' worker runs every column: "
        f"{persistent_cost.CALLS_PER_REPEAT} trivial `ranks.run` calls, one fresh `notebook_launcher` launch "
        f"and {persistent_cost.CALLS_PER_REPEAT} ipyparallel `view.apply_sync` calls (2 engines of "
        "`ipyparallel.Cluster(n=2)`) per repeat, in rotating order; ui left at its default as for every "
        "launcher. The DDP row times `ranks.run(one_step)` call to return in the worker against "
        f"{persistent_cost.STEPS_INSIDE} steps per repeat timed inside rank 0 of one call.",
        "Item 10 (benchmarks/kernel_first_launch.py): every sample starts a new Jupyter kernel, runs a cell "
        "importing torch and the launcher and a cell defining the function (the workload's source), waits "
        "0 s (Run All) or 3 s (a person reading), then times the launch cell from execute request to reply "
        "(ui left at its default: this project shows its widget panel). In a kernel this project imports "
        "torch._dynamo between cells once the notebook defines training code, and the next cell waits for "
        "that import: the 0 s rows show its cost when no one waits in between, the 3 s rows what it saves.",
        "Item 8 (result transfer): see benchmarks/result_transfer.py for the method. Each way runs in its own worker "
        "process after one untimed call; the parents that fork stay on one torch thread (libgomp: a child "
        "forked after its parent ran an OpenMP region hangs). Ours and the Queue include the ranks building "
        "their state_dicts; ours returns tensors over the pages the ranks wrote (mapped copy-on-write), so "
        "the read of every byte afterwards is shown apart. The numpy and bytes rows return the same bytes as "
        "numpy arrays or one bytes object, beside a plain pickle round trip of the same values in the "
        "notebook and a numpy.copy; numpy arrays come back over the ranks' pages as tensors do, a bytes "
        "object is read once from them into the notebook's own memory.",
        collective_bookkeeping.NOTE,
        soak.NOTE,
        anchors.NOTE,
        f"Whole run: {elapsed:.0f} s.",
    ]
    if config["quick"]:
        lines.insert(0, "**QUICK MODE: tiny sizes to check the harness; do not quote these numbers.**")
    return lines


def plot_footer(machine: dict, config: dict) -> str:
    """Under every plot: where and when it was measured (and that quick numbers are not to quote)."""
    text = (f"{machine.get('cores', '?')} cores, {machine.get('cpu', '?')}, torch {machine.get('torch', '?')}, "
            f"{machine.get('date', '?')}, n={config['repeats']}")
    if busy_machine_warning(machine):
        text = f"BUSY MACHINE (load average {machine['load average at start']} at the start): noisy; " + text
    return ("QUICK MODE, do not quote; " + text) if config["quick"] else text


def render(machine: dict, config: dict, rows, companion_outputs, elapsed: float, command: str,
           plots=(), out_path: str = DEFAULT_OUT) -> str:
    out = ["# notebook_launch benchmarks", "",
           f"Command: `{command}`", "",
           "Machine: " + "; ".join(f"{k}: {v}" for k, v in machine.items() if k != "executable"), ""]
    if plots:
        here = os.path.dirname(os.path.abspath(out_path))
        out += ["Plots drawn from this table: " + ", ".join(
            f"[{os.path.basename(p)}]({os.path.relpath(p, here)})" for p in plots), ""]
    out += [render_table(rows), "", "Notes:", ""]
    warning = busy_machine_warning(machine)
    ray_notes = (([ray_cluster.NOTES] if any(row.item == "9" for row in rows) else [])
                 + ([persistent_ray.NOTES] if any(row.item == "12" for row in rows) else []))
    out += [f"- {line}" for line in ([warning] if warning else []) + notes(config, elapsed) + ray_notes]
    for name, text in companion_outputs.items():
        out += ["", f"## Output of benchmarks/{name}", "", "```", text, "```"]
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    config = only_ranks(restrict(make_config(args.quick, args.repeats), args.only), args.ranks)
    machine = machine_description()
    started = time.monotonic()

    def say(message):
        print(f"[{time.monotonic() - started:6.1f} s] {message}", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="notebook-launch-bench-") as log_dir:
        rows, companion_outputs = measure(config, args.only, log_dir, say)
    elapsed = time.monotonic() - started
    # quoted as a shell takes it: `--plots ""` (no plots) must read back as a command that runs
    given = argv if argv is not None else sys.argv[1:]
    command = "python benchmarks/run.py " + " ".join(shlex.quote(a) for a in given)
    plots = write_plots(rows, args.plots, plot_footer(machine, config)) if args.plots else []
    text = render(machine, config, rows, companion_outputs, elapsed, command.strip(), plots, args.out)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(text)
    print(text)
    say(f"wrote {args.out}" + (f" and {', '.join(plots)}" if plots else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
