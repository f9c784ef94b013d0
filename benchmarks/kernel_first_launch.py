"""Item 10: the first launch in a fresh Jupyter kernel, as a notebook runs it: one cell
imports torch and the launcher, a later cell launches.

Every sample starts a new kernel (this interpreter's ipykernel), runs the import cell
and a cell defining the function, waits ``think`` seconds (0: "Run All", cells back to
back; 3: a person reading before running the next cell), then times the launch cell
from the execute request to its reply. In a kernel this project imports torch._dynamo
between cells once the notebook defines training code (backends/warm_imports.py), and
the next cell waits for that import, so the 0 s rows show what it costs when nobody
waits in between and the 3 s rows what it saves.
Launchers take turns in an order that rotates every repeat.
"""
from __future__ import annotations

import inspect
import os
import time

from . import workloads
from .common import REPO_ROOT
from .launch_cost import MEASUREMENTS, rotated
from .table import Cell, Row, fmt_ratio, ratio

LAUNCHERS = ("ours", "accelerate")
THINK_SECONDS = (0.0, 3.0)
# As a notebook is laid out: a cell of imports, a cell that defines the function (in the
# notebook, where this project reads it to decide whether to import torch._dynamo between
# cells), and the launch cell, the first to run after the definition.
IMPORT_CELL = {
    "ours": "import torch\nfrom notebook_launch import notebook_launcher\nfrom benchmarks.common import free_port",
    "accelerate": "import torch\nfrom accelerate import notebook_launcher\nfrom benchmarks.common import free_port",
}
LAUNCH_CELL = {
    "ours": "notebook_launcher({workload}, num_processes={ranks}, use_port=free_port())",
    "accelerate": "notebook_launcher({workload}, num_processes={ranks}, use_port=str(free_port()))",
}


def time_in_new_kernel(launcher: str, workload: str, ranks: int, think: float, log_dir: str) -> float:
    """Seconds from the launch cell's execute request to its reply, in a fresh kernel."""
    from jupyter_client.manager import start_new_kernel
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["NOTEBOOK_LAUNCH_LOG_DIR"] = os.path.join(log_dir, "rank-logs")
    manager, client = start_new_kernel(kernel_name="python3", cwd=REPO_ROOT, env=env, startup_timeout=120)
    try:
        _execute(client, IMPORT_CELL[launcher])
        _execute(client, "import os\n" + inspect.getsource(getattr(workloads, workload)))
        time.sleep(think)
        started = time.perf_counter()
        _execute(client, LAUNCH_CELL[launcher].format(workload=workload, ranks=ranks))
        return time.perf_counter() - started
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def _execute(client, code: str) -> None:
    reply = client.execute_interactive(code, timeout=300, output_hook=lambda message: None)
    if reply["content"]["status"] != "ok":
        content = reply["content"]
        raise RuntimeError(f"cell failed: {content.get('ename')}: {content.get('evalue')}")


def run(config, log_dir, say=print):
    rows = []
    for workload in ("trivial", "first_step"):
        for think in THINK_SECONDS[:1] if config["quick"] else THINK_SECONDS:   # quick: Run All only
            say(f"item 10: {workload}, fresh Jupyter kernels, launch cell {think:.0f} s after the import cell")
            cells = {name: Cell() for name in LAUNCHERS}
            for repeat in range(config["repeats"]):
                for name in rotated(LAUNCHERS, repeat):
                    if cells[name].text:
                        continue
                    try:
                        cells[name].samples.append(time_in_new_kernel(name, workload, 2, think, log_dir))
                    except Exception as exc:   # reported in the table instead of a number
                        cells[name] = Cell(text=f"error: {type(exc).__name__}: {exc}"[:200])
            rows.append(make_row(workload, think, cells))
    return rows


def make_row(workload: str, think: float, cells) -> Row:
    when = "right after the import cell (Run All)" if think == 0 else \
        f"{think:.0f} s after the import cell (a person reading)"
    row = Row(item="10", measurement=f"{MEASUREMENTS[workload]}, first launch in a fresh Jupyter kernel, "
                                     f"launch cell {when}", ranks="2", unit="s", cells=dict(cells),
              group=1 if workload == "first_step" else 0, condition="kernel")
    for name in ("start_processes", "elastic"):
        row.cells[name] = Cell(text="not measured")
    vs_accelerate = ratio(row.median("accelerate"), row.median("ours"))
    row.ratios = f"Accelerate/ours {fmt_ratio(vs_accelerate)}"
    row.goal = "— (reported)"
    return row
