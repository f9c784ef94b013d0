"""Items 3 and 4 as measured by companion scripts, when this build has them.

``benchmarks/progress_cost.py`` and ``benchmarks/widget_traffic.py`` come with
the progress/widget display work. When present, each is run as
``python benchmarks/NAME.py [--quick]`` in a fresh process and its output is
kept verbatim in RESULTS.md under the table; the item 4 row points at it.
When absent, the item 4 row says "not available in this build".
"""
from __future__ import annotations

import os
import subprocess
import sys

from .common import REPO_ROOT
from .table import NOT_AVAILABLE, Cell, Row

SCRIPTS = {"3": "progress_cost.py", "4": "widget_traffic.py"}
TIMEOUT = 600


def script_path(name: str) -> str:
    return os.path.join(REPO_ROOT, "benchmarks", name)


def run_script(name: str, quick: bool) -> str:
    command = [sys.executable, script_path(name)] + (["--quick"] if quick else [])
    env = dict(os.environ, PYTHONPATH=REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    try:
        done = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        return f"(timed out after {TIMEOUT} s)"
    text = done.stdout.strip()
    if done.returncode != 0:
        text += f"\n(exit status {done.returncode})\n{done.stderr.strip()[-2000:]}"
    return text


def run(config, log_dir, say=print):
    """Returns (rows, {script name: its output})."""
    outputs = {}
    for item, name in SCRIPTS.items():
        if os.path.exists(script_path(name)):
            say(f"item {item}: running companion script benchmarks/{name}")
            outputs[name] = run_script(name, config["quick"])
    row = Row(item="4", measurement="widget traffic: comm messages per second, 8 ranks each stepping "
                                    "100,000 times per second, counted with a recording comm",
              ranks="8", unit="msg/s", goal="≤ 60 msg/s", group=3)
    for column in ("accelerate", "start_processes", "elastic"):
        row.cells[column] = Cell(text="—")
    if SCRIPTS["4"] in outputs:
        row.cells["ours"] = Cell(text=f"see benchmarks/{SCRIPTS['4']} output below the table")
        row.met = "see below"
    else:
        row.cells["ours"] = Cell(text=NOT_AVAILABLE)
        row.met = "unknown (not measured)"
    return [row], outputs
