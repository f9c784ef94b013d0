"""The panel as a person sees it: a real JupyterLab server, headless Chromium.

Runs a 4-rank launch of 50,000 tqdm iterations per rank (printing a line every
50 steps, far faster than the notebook could show), a failing launch, a
long launch stopped with the panel's Stop button, and persistent ranks: a
``%%ranks`` cell with a bar, one stopped with Stop, and the state pulled after. Checks in the page that every
bar reaches 100%, that "IOPub message rate exceeded" never appears, that the
failing rank's row turns red with its error (and the error output names the
cell, "Cell In[..]", not our files), that the logged loss is drawn as a curve
(an SVG path per rank), that Stop ends the run with
KeyboardInterrupt and the kernel lives on (no "kernel died" restart, no zmq
abort in the server log), and that every panel ends as a picture: once its run
ended, the live widgets are gone from the page and static HTML of the final
panel (bars, statuses, curves, the error row; no Stop button) is in their place.
Screenshots and the server's log (with the kernel's stderr) go to test-artifacts/;
on failure the log's tail is printed.

Waits are generous (a loaded 2-core CI machine): a passing run never waits
them out, and a failing one says which step was slow.

Needs Debian's chromium (scripts/system-packages.sh installs it) and the
`playwright` Python package (no `playwright install`: no browser download).
"""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from benchmarks.lab_driver import (
    CHROMIUM, PICTURE_BARS, cell, chromium_page, jupyterlab, open_notebook, run_cell, shut_down_kernels,
    wait_for_bars, wait_for_text, wait_ended,
)
TESTS = Path(__file__).resolve().parent
ARTIFACTS = TESTS.parent / "test-artifacts"

pytestmark = [
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="needs Debian's chromium: bash scripts/system-packages.sh"),
    pytest.mark.timeout(900),
]

CELLS = [
    # 0: 4 ranks x 50,000 tqdm steps, a printed line every 50 steps (4,000 lines)
    '''from notebook_launch import notebook_launcher, progress

def train(n):
    import os
    from tqdm.auto import tqdm
    rank = int(os.environ["RANK"])
    bar = tqdm(range(n), desc="train")
    for i in bar:
        if i % 50 == 0:
            print(f"rank {rank} step {i}")
        if i % 5000 == 0:
            bar.set_postfix(loss=1.0 / (i + 1))
    return rank

results = notebook_launcher(train, args=(50_000,), num_processes=4)
print("RESULTS", results)''',
    # 1: rank 1 fails half way
    '''def train_fails(n):
    import os
    rank = int(os.environ["RANK"])
    for i in progress(range(n), desc="train"):
        if rank == 1 and i == n // 2:
            raise ValueError("boom at half way")
    return rank

notebook_launcher(train_fails, args=(20_000,), num_processes=2)''',
    # 2: a long run, stopped with the Stop button
    '''def train_slow(n):
    import time
    for i in progress(range(n), desc="slow"):
        time.sleep(0.01)
    return "never"

notebook_launcher(train_slow, args=(100_000,), num_processes=2)''',
    'print("AFTER STOP CELL RAN")',
    # 4-7: persistent ranks: a %%ranks cell with a bar, one stopped with Stop, then the state is still there
    '%load_ext notebook_launch\n%ranks start -n 2',
    '''%%ranks
import os
rank = int(os.environ["RANK"])
counted = 0
for i in progress(range(2000), desc="ranks cell"):
    counted += 1
print(f"persistent rank {rank} counted {counted}")''',
    '''%%ranks
import time
for i in progress(range(100_000), desc="slow"):
    time.sleep(0.01)''',
    'pulled = %ranks pull counted\nprint("PULLED", pulled)\n%ranks stop',
]


# A second notebook (issues 25 and 20): Lightning's default (rich) progress bar in the panel, then
# a run that hangs (rank 1 skips an all_reduce), marked stalled, asked "Where are they?", stopped.
LIBRARY_CELLS = [
    # 0: Lightning fit with its default RichProgressBar
    '''from notebook_launch import notebook_launcher

def fit():
    import torch
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader, TensorDataset

    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, _):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.layer(x), y)
            self.log("train_loss", loss, prog_bar=True)
            return loss

        def validation_step(self, batch, _):
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self.layer(x), y))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    data = TensorDataset(torch.randn(256, 4), torch.randn(256, 1))
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=3, logger=False,
                         enable_checkpointing=False, enable_model_summary=False)
    trainer.fit(Tiny(), DataLoader(data, batch_size=8), DataLoader(data, batch_size=32))
    return type(trainer.progress_bar_callback).__name__

print("LIGHTNING", notebook_launcher(fit, num_processes=2))''',
    # 1: rank 1 never reaches the all_reduce: stalled after 2 s; the button asks where they are
    '''def hangs():
    import os, time
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    rank = int(os.environ["RANK"])
    print(f"rank {rank} before the all_reduce")
    if rank == 1:
        time.sleep(3600)          # an evaluation only rank 1 runs, say
    dist.all_reduce(torch.ones(1))
    return rank

notebook_launcher(hangs, num_processes=2, stall_after=2)''',
]


# A third notebook (issue 47): the panel's layout as a person sees it, measured in the page. Two ranks
# whose rows differ (a longer description, long output lines): the bars must still line up.
# The ranks hold half way (logging, so never stalled) until the test has measured the live panel and
# touches LAYOUT_MEASURED (``release``): a run of a fixed length ended, on a loaded CI machine, before the
# page had shown rank 1's metrics, and the test then waited for a live panel that was already a picture.
LAYOUT_MEASURED = "layout-measured"
LAYOUT_CELLS = [
    f'''import os
from notebook_launch import notebook_launcher, progress

def layout_run(steps, measured):
    import os, time
    rank = int(os.environ["RANK"])
    held_until = time.monotonic() + 600   # the test failed without touching the file: end anyway
    for step in progress(range(steps), desc="train" if rank == 0 else "train, the longer description"):
        time.sleep(0.05)
        progress.log(loss=1.0 / (step + 1), learning_rate=0.001 * (rank + 1))
        if step % 20 == 0:
            print(f"rank {{rank}} step {{step}} " + "a long line of output " * 5 * rank)
        while step == steps // 2 and not os.path.exists(measured) and time.monotonic() < held_until:
            time.sleep(0.05)
            progress.log(loss=1.0 / (step + 1), learning_rate=0.001 * (rank + 1))
    return rank

print("LAYOUT", notebook_launcher(layout_run, args=(400, os.path.abspath("{LAYOUT_MEASURED}")), num_processes=2))''',
]


def release(lab, name: str) -> None:
    """Let a held run go on: its ranks wait, live, for this file in the notebooks' folder (the
    kernel's working folder) while the test looks at the live panel."""
    (lab.root / name).touch()


@pytest.fixture
def lab(tmp_path):
    """A JupyterLab server on 127.0.0.1 with a token, in its own config dirs (benchmarks/lab_driver.py)."""
    pytest.importorskip("playwright")
    pytest.importorskip("jupyterlab")
    from helpers.kernel_ports import kernel_ports
    from helpers.lab_kernels import SERVER_OPTION
    notebooks = {"panel.ipynb": CELLS, "libraries.ipynb": LIBRARY_CELLS, "layout.ipynb": LAYOUT_CELLS}
    # The server's kernels get ports of the server's own block (helpers.lab_kernels, imported from tests/
    # in its process), and the server a port of this process's block: none of them can be taken before
    # it is bound, as ports bind(0) picks can (helpers.kernel_ports).
    environ = {"NOTEBOOK_LAUNCH_LOG_DIR": str(tmp_path / "runs"),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))}
    try:
        with jupyterlab(tmp_path, environ, notebooks, server_args=[SERVER_OPTION],
                        port=kernel_ports(count=1)[0]) as server:
            yield server
    finally:
        if (tmp_path / "lab.log").exists():
            ARTIFACTS.mkdir(exist_ok=True)
            shutil.copyfile(tmp_path / "lab.log", ARTIFACTS / "jupyter-server.log")


# In the server's log, what a dying kernel leaves: libzmq's abort on an fd
# closed under it, and the server restarting the kernel.
KERNEL_DEATH_SIGNS = ("Bad file descriptor", "signaler.cpp", "restarting kernel", "Kernel restarted")






def test_panel_in_jupyterlab(lab):
    in_browser(lab, run_scenario)


def test_lightning_and_a_stalled_run_in_jupyterlab(lab):
    in_browser(lab, run_library_scenario)


def test_panel_layout_in_jupyterlab(lab):
    """Issue 47: at 1280x800 with the file browser open and at ~700 px of output, live and as its
    final picture, every row's bar lines up, rows take one or two lines, no figure is cut, and the
    picture is as high as the live panel was."""
    in_browser(lab, run_layout_scenario, viewport={"width": 1280, "height": 800})


# Records the panel's height every 100 ms while the cell runs: its last live height is compared
# with its picture's.
RECORD_HEIGHTS = """(index) => { window.nlHeights = []; setInterval(() => {
  const cell = [...document.querySelectorAll('.jp-CodeCell')][index];
  const panel = cell && cell.querySelector('.nl-panel');
  if (panel) window.nlHeights.push({live: cell.querySelectorAll('.jupyter-widgets').length > 0,
                                    h: panel.getBoundingClientRect().height});
}, 100); }"""


def run_layout_scenario(page, lab):
    from helpers.panel_layout import assert_rows_laid_out, assert_same_height, measure
    open_notebook(page, lab, "layout.ipynb")
    page.evaluate("window.jupyterapp.commands.execute('filebrowser:activate')")
    page.locator(".jp-FileBrowser").first.wait_for(timeout=30_000)
    page.evaluate(RECORD_HEIGHTS, 0)
    run_cell(page, 0)
    live = cell(page, 0)
    live.locator(".jupyter-widgets .nl-rank .nl-resources").nth(1).wait_for(timeout=240_000)
    live.locator(".jupyter-widgets .nl-rank .nl-metrics").nth(1).wait_for(timeout=60_000)
    wide = measure(page, 0)
    live.screenshot(path=str(ARTIFACTS / "panel-layout-1280.png"))
    assert wide["live"], wide
    assert_rows_laid_out(wide, "live, 1280x800 with the file browser open")
    narrow_width = round(1280 - (wide["output"]["w"] - 700))
    page.set_viewport_size({"width": narrow_width, "height": 800})
    page.wait_for_timeout(1500)   # a redraw or two at the new width
    narrow = measure(page, 0)
    live.screenshot(path=str(ARTIFACTS / "panel-layout-700.png"))
    assert narrow["live"] and 650 <= narrow["output"]["w"] <= 750, narrow
    # a row too long for one line wraps under its bar, whole figures on each line: the bar and its
    # counts, the metrics, the resources (and a long description on a line of its own)
    assert_rows_laid_out(narrow, f"live, {narrow['output']['w']:.0f} px of output", max_lines=4)
    page.set_viewport_size({"width": 1280, "height": 800})
    release(lab, LAYOUT_MEASURED)   # the run's second half is live at 1280 px again: its last live height
    wait_for_text(page, 0, "LAYOUT [0, 1]", 240)
    wait_ended(page, 0)
    heights = page.evaluate("window.nlHeights")
    last_live = [h["h"] for h in heights if h["live"]][-1]
    picture = measure(page, 0)
    live.screenshot(path=str(ARTIFACTS / "panel-layout-picture.png"))
    assert not picture["live"], picture
    assert_same_height(last_live, picture["panel"]["h"])
    assert_rows_laid_out(picture, "the final picture, 1280x800")
    page.set_viewport_size({"width": narrow_width, "height": 800})
    page.wait_for_timeout(500)
    live.screenshot(path=str(ARTIFACTS / "panel-layout-picture-700.png"))
    assert_rows_laid_out(measure(page, 0), "the final picture, ~700 px of output", max_lines=4)


def in_browser(lab, scenario, viewport=None):
    ARTIFACTS.mkdir(exist_ok=True)
    size = viewport or {"width": 1500, "height": 1100}
    with chromium_page(size["width"], size["height"]) as page:
        try:
            scenario(page, lab)
            shut_down_kernels(lab)   # its stderr (a zmq abort at exit, say) reaches the log now
            log = lab.log.read_text()
            signs = [sign for sign in KERNEL_DEATH_SIGNS if sign in log]
            assert not signs, f"the kernel died or aborted ({signs}):\n{log[-4000:]}"
        except BaseException:
            try:
                page.screenshot(path=str(ARTIFACTS / "panel-browser-failure.png"), full_page=True)
            except Exception as shot_failed:   # the page may be gone with the browser: the log matters more
                print(f"(no failure screenshot: {shot_failed})")
            print("---- jupyter server log (tail; whole log: test-artifacts/jupyter-server.log) ----")
            print(lab.log.read_text()[-6000:])
            raise






def run_library_scenario(page, lab):
    open_notebook(page, lab, "libraries.ipynb")

    # 1. Lightning's default (rich) bar: rank 0's row ends on the training bar, every epoch counted
    run_cell(page, 0)
    wait_for_text(page, 0, "LIGHTNING ['RichProgressBar', 'RichProgressBar']", 600)
    wait_ended(page, 0)
    first_row = cell(page, 0).locator(".nl-rank").nth(0).inner_text()
    assert "Epoch 2" in first_row and "16/16" in first_row and "Sanity" not in first_row, first_row
    output_text = cell(page, 0).locator(".jp-OutputArea").inner_text()
    assert "\x1b[" not in output_text and "[2K" not in output_text, output_text[-2000:]
    cell(page, 0).screenshot(path=str(ARTIFACTS / "panel-lightning.png"))

    # 2. a rank skips the all_reduce: both rows stalled with how long; the button's answer
    run_cell(page, 1)
    live = cell(page, 1)
    live.locator(".nl-rank.nl-stalled").nth(1).wait_for(timeout=240_000)
    assert "stalled 00:0" in live.locator(".nl-rank").nth(0).inner_text()
    # a rank's recent lines, on demand: open rank 1's section
    live.get_by_text("rank 1: recent log lines").click()
    live.locator(".jupyter-widgets pre").get_by_text("rank 1 before the all_reduce").first.wait_for(timeout=60_000)
    live.screenshot(path=str(ARTIFACTS / "panel-stalled.png"))
    where = live.locator(".nl-panel button", has_text="Where are they?")
    assert where.is_enabled()
    where.click()
    verdict = live.locator(".nl-where-verdict")
    verdict.wait_for(timeout=120_000)
    text = verdict.inner_text()
    assert "rank 1 never reached it" in text and "all_reduce" in text, text
    live.locator(".nl-where-stacks summary").click()
    live.locator(".nl-where-stacks pre").get_by_text("time.sleep(3600)").first.wait_for(timeout=30_000)
    live.screenshot(path=str(ARTIFACTS / "panel-where-are-they.png"))
    live.locator(".nl-panel button", has_text="Stop").click()
    wait_for_text(page, 1, "stopped with the Stop button", 180)
    wait_ended(page, 1)
    assert "rank 1 never reached it" in live.locator(".nl-panel .nl-where-verdict").inner_text()
    live.screenshot(path=str(ARTIFACTS / "panel-stalled-stopped.png"))


def run_scenario(page, lab):
    open_notebook(page, lab, "panel.ipynb")
    run_cell(page, 0)

    # 1. every rank's bar reaches 100% and the run returns every result; the panel ends as a picture
    wait_for_text(page, 0, "RESULTS [0, 1, 2, 3]", 360)
    wait_for_bars(page, 0, 4, "b.style.width == '100%'", 90, PICTURE_BARS)
    wait_ended(page, 0)
    rows = cell(page, 0).locator(".nl-rank.nl-status-done")
    assert rows.count() == 4
    panel_text = cell(page, 0).locator(".nl-panel").inner_text()
    assert "50000/50000" in panel_text and "loss=" in panel_text, panel_text
    # each rank's resources in its row (its peak own memory, once ended), the machine's in the header
    assert cell(page, 0).locator(".nl-panel .nl-rank .nl-resources").count() == 4
    assert " resident" in panel_text and "machine memory " in panel_text, panel_text
    cell(page, 0).screenshot(path=str(ARTIFACTS / "panel-4-ranks-done.png"))
    # the logged loss drawn as a curve: one SVG path per rank in the panel
    curves = cell(page, 0).locator(".nl-panel .nl-curves svg path.nl-curve")
    assert curves.count() == 4, cell(page, 0).locator(".nl-panel").inner_html()[:3000]
    assert all(curves.nth(i).get_attribute("d").startswith("M") for i in range(4))
    cell(page, 0).locator(".nl-panel .nl-curves").screenshot(path=str(ARTIFACTS / "panel-curves.png"))

    # 2. the failing rank's row is red and carries its error
    run_cell(page, 1)
    wait_for_text(page, 1, "LaunchError", 240)
    failed = cell(page, 1).locator(".nl-rank.nl-status-failed")
    failed.first.wait_for(timeout=90_000)
    assert "ValueError: boom at half way" in failed.first.inner_text()
    # the error points at the cell the rank ran, not at notebook_launch's files
    wait_for_text(page, 1, "Cell In[", 60)
    output_text = cell(page, 1).locator(".jp-OutputArea").inner_text()
    assert "Cell In[2], line 6, in train_fails" in output_text, output_text
    assert not re.search(r"notebook_launch/[\w/]*\.py", output_text), output_text
    color = failed.first.locator(".nl-status").evaluate("e => getComputedStyle(e).backgroundColor")
    assert color == "rgb(220, 38, 38)", color
    wait_ended(page, 1)
    cell(page, 1).screenshot(path=str(ARTIFACTS / "panel-failed-rank.png"))

    # 3. Stop ends the run like an interrupt; the next cell still runs afterwards
    run_cell(page, 2)
    stop = cell(page, 2).locator(".nl-panel button", has_text="Stop")
    stop.wait_for(timeout=240_000)
    wait_for_bars(page, 2, 2, "parseFloat(b.style.width) > 0", 180)   # the live widgets
    cell(page, 2).locator(".nl-resources", has_text=" resident").nth(1).wait_for(timeout=60_000)   # live too
    cell(page, 2).screenshot(path=str(ARTIFACTS / "panel-running-before-stop.png"))
    assert stop.is_enabled()
    stop.click()
    wait_for_text(page, 2, "KeyboardInterrupt", 180)
    cell(page, 2).locator(".nl-rank.nl-status-stopped").nth(1).wait_for(timeout=90_000)
    wait_ended(page, 2)
    cell(page, 2).screenshot(path=str(ARTIFACTS / "panel-stopped.png"))
    run_cell(page, 3)
    wait_for_text(page, 3, "AFTER STOP CELL RAN", 180)

    # 4. a %%ranks cell: the same panel per call; Stop interrupts it and the ranks keep their state
    run_cell(page, 4)
    wait_for_text(page, 4, "fork, persistent", 240)
    run_cell(page, 5)
    wait_for_text(page, 5, "persistent rank 1 counted 2000", 240)
    wait_for_bars(page, 5, 2, "b.style.width == '100%'", 90, PICTURE_BARS)
    wait_ended(page, 5)
    assert cell(page, 5).locator(".nl-rank.nl-status-done").count() == 2
    cell(page, 5).screenshot(path=str(ARTIFACTS / "panel-ranks-cell.png"))
    run_cell(page, 6)
    stop = cell(page, 6).locator(".nl-panel button", has_text="Stop")
    stop.wait_for(timeout=240_000)
    wait_for_bars(page, 6, 2, "parseFloat(b.style.width) > 0", 180)
    stop.click()
    wait_for_text(page, 6, "KeyboardInterrupt", 180)
    cell(page, 6).locator(".nl-rank.nl-status-stopped").nth(1).wait_for(timeout=90_000)
    assert "alive, state kept" in cell(page, 6).locator(".nl-panel").inner_text()
    wait_ended(page, 6)
    cell(page, 6).screenshot(path=str(ARTIFACTS / "panel-ranks-stopped.png"))
    run_cell(page, 7)
    wait_for_text(page, 7, "PULLED [2000, 2000]", 180)

    # nothing was dropped by the server's IOPub rate limit
    body = page.locator("body").inner_text()
    assert "IOPub message rate exceeded" not in body
    assert "IOPub data rate exceeded" not in body
    page.screenshot(path=str(ARTIFACTS / "panel-notebook.png"), full_page=True)
    assert "rate exceeded" not in lab.log.read_text()







