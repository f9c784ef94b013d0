"""Refresh the panel pictures of the docs (docs/images/panel/*.png) from a real run.

    .venv/bin/python scripts/panel_pictures.py            # about 3 minutes on 2 cores
    .venv/bin/python scripts/panel_pictures.py --out /tmp/pictures --only running,failed

It drives JupyterLab and headless Debian chromium as tests/test_browser_panel.py and the soak benchmark
do (benchmarks/lab_driver.py, one driver for the three): a JupyterLab server with a notebook of real
launches, opened in Chromium, and a screenshot of each cell's panel at the moment the guide describes:

- running.png: 4 ranks training, live, bars part way, the loss logged as metrics;
- curves.png: the curves of that run, one line per rank, in the panel's final picture;
- failed.png: rank 1 raises half way: its row red with its error, the traceback naming the cell;
- stalled.png: rank 1 asleep, rank 0 waiting for it in an all_reduce (``stall_after=3``): the panel marks
  both stalled.

A scene whose moment never comes (the panel never shows "stalled", say) is reported and its old
picture kept; the command then exits with status 1. Needs the test extra (jupyterlab, playwright) and
Debian's chromium (scripts/system-packages.sh).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))   # for benchmarks.lab_driver, run as a script
from benchmarks.lab_driver import (  # noqa: E402
    CHROMIUM, cell, chromium_page, jupyterlab, open_notebook, run_cell, wait_for_bars, wait_for_text,
    wait_ended,
)

SETUP = '''import time
from notebook_launch import notebook_launcher, progress'''

RUNNING = '''def train(steps):
    import os, math, time
    rank = int(os.environ["RANK"])
    for step in progress(range(steps), desc="train"):
        time.sleep(0.03)
        loss = 2.0 * math.exp(-step / (60 + 15 * rank)) + 0.03 * math.sin(step / 7)
        grad_norm = 1.0 + math.exp(-step / 90) + 0.1 * math.cos(step / 5 + rank)
        progress.log(loss=loss, grad_norm=grad_norm)
        if step % 100 == 0:
            print(f"step {step} loss {loss:.3f}")
    return {"rank": rank, "loss": loss}

results = notebook_launcher(train, args=(600,), num_processes=4)'''

FAILED = '''def train_fails(steps):
    import os, time
    rank = int(os.environ["RANK"])
    for step in progress(range(steps), desc="train"):
        time.sleep(0.002)
        if rank == 1 and step == steps // 2:
            raise ValueError(f"bad batch at step {step}")
    return rank

notebook_launcher(train_fails, args=(2000,), num_processes=2)'''

STALLED = '''def train_stalls(steps):
    import os, time, torch, torch.distributed as dist
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for step in progress(range(steps), desc="train"):
        time.sleep(0.01)
        if step == 100:
            if rank == 1:
                time.sleep(3600)         # never reaches the all_reduce below
            dist.all_reduce(torch.ones(1))   # rank 0 waits here for rank 1
    return rank

notebook_launcher(train_stalls, args=(10_000,), num_processes=2,
                  stall_after=3, timeout=60)'''

CELLS = [SETUP, RUNNING, FAILED, STALLED]


def scene_running(page: Any, out: Path) -> list[str]:
    run_cell(page, 1)
    wait_for_bars(page, 1, 4, "parseFloat(b.style.width) > 35", 240)
    cell(page, 1).screenshot(path=str(out / "running.png"))
    wait_ended(page, 1)
    curves = cell(page, 1).locator(".nl-panel .nl-curves")
    curves.locator("svg path.nl-curve").first.wait_for(timeout=60_000)
    curves.screenshot(path=str(out / "curves.png"))
    return ["running.png", "curves.png"]


def scene_failed(page: Any, out: Path) -> list[str]:
    run_cell(page, 2)
    wait_for_text(page, 2, "LaunchError", 240)
    cell(page, 2).locator(".nl-rank.nl-status-failed").first.wait_for(timeout=90_000)
    wait_for_text(page, 2, "Cell In[", 60)
    wait_ended(page, 2)
    cell(page, 2).screenshot(path=str(out / "failed.png"))
    return ["failed.png"]


def scene_stalled(page: Any, out: Path) -> list[str]:
    run_cell(page, 3)
    panel = cell(page, 3).locator(".nl-panel")
    panel.first.wait_for(timeout=240_000)
    try:
        panel.get_by_text("stalled", exact=False).first.wait_for(timeout=45_000)
    except Exception:
        raise RuntimeError("the panel never showed 'stalled' (stall_after=3, no rank moving)") from None
    cell(page, 3).screenshot(path=str(out / "stalled.png"))
    wait_for_text(page, 3, "LaunchError", 120)    # its timeout= ends the run
    return ["stalled.png"]


SCENES: dict[str, Callable[[Any, Path], list[str]]] = {
    "running": scene_running, "failed": scene_failed, "stalled": scene_stalled}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Refresh the docs' panel pictures from a real run in JupyterLab.")
    parser.add_argument("--out", default=str(REPO / "docs" / "images" / "panel"),
                        help="folder for the PNG files (default: %(default)s)")
    parser.add_argument("--only", default=",".join(SCENES),
                        help="scenes to take, comma-separated (default: %(default)s; running also takes curves)")
    args = parser.parse_args(argv)
    only = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = [name for name in only if name not in SCENES]
    if unknown:
        parser.error(f"unknown scene(s) {unknown}; choose from {', '.join(SCENES)}")
    if not os.path.exists(CHROMIUM):
        print("panel_pictures: needs Debian's chromium (bash scripts/system-packages.sh)", file=sys.stderr)
        return 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="panel-pictures-") as tmp, \
            jupyterlab(Path(tmp), {"NOTEBOOK_LAUNCH_LOG_DIR": f"{tmp}/runs"}, {"panel.ipynb": CELLS}) as lab, \
            chromium_page(1100, 1800, scale=1) as page:
        open_notebook(page, lab, "panel.ipynb")
        run_cell(page, 0)
        page.wait_for_timeout(3000)
        for name in only:
            try:
                written = SCENES[name](page, out)
                print(f"panel_pictures: {name}: wrote " + ", ".join(str(out / f) for f in written))
            except Exception as err:   # one scene's failure keeps the others' pictures
                failures.append(f"{name}: {err}")
                print(f"panel_pictures: {name}: FAILED, its old picture is kept: {err}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
