"""The command of a benchmark that runs on its own (it needs root and a cluster of its own, so
benchmarks/run.py leaves it out): its options, its run in a temporary folder, and the page it writes.
Written once for each such benchmark (ours on SLURM beside submitit, Monarch's SlurmJob beside ours)."""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .common import machine_description


@dataclass
class AloneRun:
    """What one run measured, and how it was asked for."""
    args: argparse.Namespace
    config: dict
    machine: dict
    rows: list
    started: float

    @property
    def command(self) -> str:
        return f"python -m {self.args.prog} --repeats {self.args.repeats}" + (" --quick" if self.args.quick else "")


def run_alone(prog: str, default_out: str, quick_help: str, run: Callable[[dict, str, Callable], list],
              argv: list[str] | None) -> AloneRun:
    """Read the options (a bad one is refused before anything starts), then run the rows with a
    progress line on stderr, in a temporary log folder the cluster's users can read."""
    parser = argparse.ArgumentParser(prog=f"python -m {prog}")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--out", default=default_out)
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1; got {args.repeats}")
    args.prog = prog
    config = {"repeats": args.repeats, "quick": args.quick}
    machine = machine_description()
    started = time.monotonic()

    def say(text: str) -> None:
        print(f"[{time.monotonic() - started:6.1f} s] {text}", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix=f"nl-bench-{prog.rsplit('.', 1)[-1]}-") as log_dir:
        os.chmod(log_dir, 0o755)
        rows = run(config, log_dir, say)
    return AloneRun(args, config, machine, rows, started)


def write_page(done: AloneRun, title: str, command: str, machine_extra: str, notes: list[str]) -> int:
    """The page: title, command, machine, the busy and quick warnings, the table, the notes."""
    from .run import busy_machine_warning
    from .table import render_table
    text = [f"# {title}", "", f"Command: `{command}`", "",
            "Machine: " + "; ".join(f"{k}: {v}" for k, v in done.machine.items() if k != "executable")
            + machine_extra, ""]
    warning = busy_machine_warning(done.machine)
    text += [warning, ""] if warning else []
    text += ["**QUICK MODE: checks the harness; do not quote these numbers.**", ""] if done.args.quick else []
    text += [render_table(done.rows), "", "Notes:", "", *[f"- {note}" for note in notes],
             f"- Each timed cell: median (min–max, n). Whole run: {time.monotonic() - done.started:.0f} s."]
    Path(done.args.out).write_text("\n".join(text) + "\n")
    print("\n".join(text))
    return 0
