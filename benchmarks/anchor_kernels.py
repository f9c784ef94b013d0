"""Item 15's notebook row: a warm call made from a Jupyter kernel's cell, as a notebook user makes it.

Why a row of its own: the script rows (benchmarks/anchors.py) measured 0.4-0.6 ms for a warm
``ranks.run(f)`` while the same call in a kernel took 32 ms: there the default display is the
widget panel, and every call drew and closed one (issue 45; now a call's panel waits until the
call lasts, display/deferred.py). What a user of a notebook sees is this row's.

Each side runs in a kernel of its own venv's Python (ours: this venv's; Monarch's: .venv-monarch,
with ipykernel, ``scripts/setup-anchors.sh``), started from a kernelspec written under the run's
log folder. A setup cell starts 2 ranks (ours: ``start_ranks(2)``, the default ``ui``; Monarch: an
actor on each of 2 procs), then cells of BLOCK calls each alternate between the two kernels, each
cell timing its own calls and printing them. Monarch's calls are awaited (``await
actors.rank.call()``), as Monarch asks in a notebook: ``.get()`` in a kernel's cell warns on every
call that it blocks the kernel's event loop.

A second row does the same for a warm 4-rank launch: ``notebook_launcher`` (the default ``ui``, the
widget panel, drawn once a launch lasts: display/deferred.py) against torch's
``start_processes(fork)``, each in a kernel of this venv, cells of BLOCK launches taking turns.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys

from .anchors import BLOCK, NOTEBOOK_CELL, venv_python
from .common import REPO_ROOT
from .table import Row

SETUP = {
    "ours": NOTEBOOK_CELL + "from notebook_launch import start_ranks\nranks = start_ranks(2)\nranks.run(trivial)\n",
    "monarch": (
        "from monarch.actor import Actor, current_rank, endpoint, this_host\n\n"
        "class Trivial(Actor):\n"
        "    @endpoint\n"
        "    def rank(self) -> int:\n"
        "        return int(current_rank().rank)\n\n"
        "procs = this_host().spawn_procs(per_host={'procs': 2})\n"
        "actors = procs.spawn('trivial', Trivial)\n"
        "await actors.rank.call()\n"),
}
LAUNCH_RANKS = 4
SETUP["ours launch"] = NOTEBOOK_CELL + "from notebook_launch import notebook_launcher\n"
SETUP["start_processes"] = ("from torch.multiprocessing import start_processes\n\n"
                            "def nothing(index):\n    return None\n")
CALL = {"ours": "ranks.run(trivial)", "monarch": "await actors.rank.call()",
        "ours launch": f"notebook_launcher(trivial, num_processes={LAUNCH_RANKS})",
        "start_processes": f"start_processes(nothing, nprocs={LAUNCH_RANKS}, start_method='fork')"}
for _launcher in ("ours launch", "start_processes"):   # its first launch, untimed
    SETUP[_launcher] += CALL[_launcher] + "\n"
TIMED = ("import time as _time, json as _json\n_samples = []\n"
         "for _ in range({count}):\n"
         "    _began = _time.perf_counter()\n"
         "    {call}\n"
         "    _samples.append(_time.perf_counter() - _began)\n"
         "print('SAMPLES', _json.dumps(_samples))\n")
CLOSE = {"ours": "ranks.close()", "monarch": "del actors, procs", "ours launch": "pass", "start_processes": "pass"}
CELL_TIMEOUT = 300


class KernelSide:
    """One side's kernel, started with its setup cell run."""

    def __init__(self, name: str, log_dir: str) -> None:
        from jupyter_client.kernelspec import KernelSpecManager
        from jupyter_client.manager import KernelManager
        python = venv_python(name) if name == "monarch" else sys.executable
        if python is None:
            raise FileNotFoundError(f".venv-{name} is missing: run `bash scripts/setup-anchors.sh {name}`")
        specs, kernel = os.path.join(log_dir, "kernels"), f"item15-{name.replace(' ', '-')}"
        os.makedirs(os.path.join(specs, kernel), exist_ok=True)
        with open(os.path.join(specs, kernel, "kernel.json"), "w") as spec:
            json.dump({"argv": [python, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                       "display_name": f"item 15: {name}", "language": "python"}, spec)
        env = dict(os.environ, PYTHONPATH=REPO_ROOT, NOTEBOOK_LAUNCH_LOG_DIR=os.path.join(log_dir, "rank-logs"))
        self.name = name
        self.manager = KernelManager(kernel_name=kernel,
                                     kernel_spec_manager=KernelSpecManager(kernel_dirs=[specs]))
        self.stderr = open(os.path.join(log_dir, f"kernel-{name}.stderr"), "ab")   # its warnings, Monarch's log lines
        try:
            self.manager.start_kernel(cwd=REPO_ROOT, env=env, stderr=self.stderr)
        except BaseException:
            self.stderr.close()
            raise
        self.client = self.manager.client()
        try:
            self.client.start_channels()
            self.client.wait_for_ready(timeout=120)
            self.execute(SETUP[name])
        except BaseException:
            self.close()
            raise

    def execute(self, code: str) -> str:
        """Run a cell; what it printed, or RuntimeError with its traceback."""
        msg_id = self.client.execute(code)
        printed, error = [], None
        while True:
            message = self.client.get_iopub_msg(timeout=CELL_TIMEOUT)
            if message["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = message["msg_type"], message["content"]
            if kind == "stream" and content["name"] == "stdout":
                printed.append(content["text"])
            elif kind == "error":
                error = "\n".join(content["traceback"])[-1500:]
            elif kind == "status" and content["execution_state"] == "idle":
                break
        if error is not None:
            raise RuntimeError(f"{self.name} kernel: {error}")
        return "".join(printed)

    def calls(self, count: int) -> list:
        printed = self.execute(TIMED.format(count=count, call=CALL[self.name]))
        line = [text for text in printed.splitlines() if text.startswith("SAMPLES ")][-1]
        return json.loads(line.split(" ", 1)[1])

    def close(self) -> None:
        try:
            with contextlib.suppress(Exception):   # the kernel is shut down below either way
                if self.manager.is_alive():
                    self.execute(CLOSE[self.name])
        finally:
            self.client.stop_channels()
            self.manager.shutdown_kernel(now=True)
            self.stderr.close()


def run(repeats: int, calls: int, log_dir: str) -> Row:
    """The call row: ours and Monarch's kernels (``taking_turns``)."""
    found, errors = taking_turns(("ours", "monarch"), repeats, calls, log_dir)
    return kernel_row(found, errors)


def launch_row(repeats: int, launches: int, log_dir: str) -> Row:
    """The launch row: ours and ``start_processes``' kernels (``taking_turns``)."""
    from .anchors import beside_anchor
    found, errors = taking_turns(("ours launch", "start_processes"), repeats, launches, log_dir)
    row = Row(item="15", measurement=f"warm trivial launch, {LAUNCH_RANKS} ranks, made from a Jupyter kernel's cell "
              "(the default `ui`): `notebook_launcher` vs `start_processes(fork)` in a kernel of the same venv",
              ranks=str(LAUNCH_RANKS), unit="s", group=15, goal="— (the script rows' goal is the measure of record)")
    beside_anchor(row, found, errors, ("ours launch", "start_processes"), "start_processes (fork), in a kernel")
    return row


def taking_turns(names: tuple[str, str], repeats: int, count: int, log_dir: str) -> tuple[dict, dict]:
    """Each repeat: both kernels started (order rotating), ``count`` warm calls of each in cells of
    BLOCK taking turns, both closed. Each side's samples and first error, by name."""
    found: dict = {name: [] for name in names}
    errors: dict = {}
    for repeat in range(repeats):
        order = list(names) if repeat % 2 == 0 else list(names[::-1])
        sides: dict = {}
        try:
            for name in order:
                if name not in errors:
                    try:
                        sides[name] = KernelSide(name, log_dir)
                    except (OSError, RuntimeError, ValueError) as exc:
                        errors[name] = f"{type(exc).__name__}: {exc}"[:300]
            for start in range(0, count, BLOCK):
                for name in (order if (start // BLOCK) % 2 == 0 else order[::-1]):
                    if name in sides and name not in errors:
                        try:
                            found[name] += sides[name].calls(min(BLOCK, count - start))
                        except (OSError, RuntimeError, ValueError) as exc:
                            errors[name] = f"{type(exc).__name__}: {exc}"[:300]
        finally:
            for side in sides.values():
                side.close()
    return found, errors


def kernel_row(found: dict, errors: dict) -> Row:
    from .anchors import GOAL_VS_MONARCH, beside_monarch
    row = Row(item="15", measurement="warm trivial call on 2 persistent ranks made from a Jupyter kernel's cell "
              "(the default `ui`): `ranks.run(f)` vs Monarch 0.7.0 `await actors.f.call()`", ranks="2", unit="s",
              group=15, goal=f"median <= {GOAL_VS_MONARCH:g}x Monarch's (as the script row)")
    beside_monarch(row, found, errors, GOAL_VS_MONARCH)
    return row
