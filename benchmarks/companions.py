"""Item 4, widget traffic, measured by ``benchmarks/widget_traffic.py`` (real
ipywidgets, a recording comm stands in for the browser), in a fresh process.
Item 3 is measured inside a launched rank (iteration_cost.py);
``benchmarks/progress_cost.py`` is a standalone cross-check of it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

from .common import REPO_ROOT
from .table import Cell, Row

TIMEOUT = 600
PROBE = ("import json, sys; sys.path.insert(0, 'benchmarks'); from widget_traffic import measure; "
         "print(json.dumps(measure(float(sys.argv[1]), 8)))")


def measure_traffic(seconds: float) -> dict:
    env = dict(os.environ, PYTHONPATH=REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", PROBE, str(seconds)], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT)
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip()[-2000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(config, log_dir, say=print):
    """Returns (rows, {}): the item 4 row."""
    seconds = 3.0 if config["quick"] else 10.0   # the first redraws come after a warm-up
    say(f"item 4: widget traffic for {seconds:g} s (benchmarks/widget_traffic.py)")
    row = Row(item="4", measurement="widget traffic: comm messages per second, 8 ranks each stepping "
                                    "100,000 times per second, counted with a recording comm",
              ranks="8", unit="msg/s", goal="≤ 60 msg/s", group=3)
    for column in ("accelerate", "start_processes", "elastic"):
        row.cells[column] = Cell(text="—")
    try:
        result = measure_traffic(seconds)
    except Exception as exc:  # report, never hide: the row says what failed
        row.cells["ours"] = Cell(text=f"error: {str(exc).splitlines()[-1] if str(exc) else type(exc).__name__}")
        row.met = "unknown (error)"
        return [row], {}
    row.cells["ours"] = Cell(text=f"{result['per_second']:.1f}/s on average, at most "
                                  f"{result['window_max']} in any 1 s window ({result['elapsed']:.0f} s)")
    row.met = "yes" if result["window_max"] <= 60 else f"NO ({result['window_max']} in one second)"
    return [row], {}
