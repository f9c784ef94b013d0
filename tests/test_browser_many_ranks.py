"""32 ranks in JupyterLab in headless Chromium (issue 43, part 5): the live panel and its final
picture show a few grouped rows, every row's bar starts at the same x, the failed rank has its own
row, and the header says the whole. Reuses test_browser_panel's server fixture and benchmarks/lab_driver.py;
screenshots go to test-artifacts/ (panel-many-live.png, panel-many-picture.png)."""
from __future__ import annotations

import pytest
from test_browser_panel import lab  # noqa: F401  # the JupyterLab server fixture
from test_browser_panel import ARTIFACTS, in_browser, release

from benchmarks.lab_driver import CHROMIUM, cell, open_notebook, run_cell, wait_ended, wait_for_text, write_notebook

pytestmark = [
    pytest.mark.skipif(not __import__("os").path.exists(CHROMIUM),
                       reason="needs Debian's chromium: bash scripts/system-packages.sh"),
    pytest.mark.timeout(900),
]

# The ranks hold half way (logging, so never stalled) until the test has read the live rows and
# touches LIVE_SEEN (``release``): the live panel must not end before a loaded page has shown it.
LIVE_SEEN = "many-live-seen"
MANY = f'''import os
from notebook_launch import notebook_launcher, progress

def steps(n, seen):
    import os, time
    rank = int(os.environ["RANK"])
    held_until = time.monotonic() + 600   # the test failed without touching the file: end anyway
    for i in progress(range(n), desc="train"):
        time.sleep(0.05)
        progress.log(loss=1.0 / (i + 1))
        while i == n // 2 and not os.path.exists(seen) and time.monotonic() < held_until:
            time.sleep(0.05)
            progress.log(loss=1.0 / (i + 1))
    if rank == 13:
        raise ValueError("rank 13 gives up at the end")
    return rank

notebook_launcher(steps, args=(100, os.path.abspath("{LIVE_SEEN}")), num_processes=32, start_method="fork")'''

# Every row of one cell's panel (live or picture): its kind and where its bar starts.
ROWS = """(index) => {
  const cell = [...document.querySelectorAll('.jp-CodeCell')][index];
  const panel = cell.querySelector('.nl-panel');
  if (!panel) return null;
  const live = cell.querySelectorAll('.jupyter-widgets').length > 0;
  const rows = [...panel.querySelectorAll('tr.nl-rank, tr.nl-group')].map(row => ({
    group: row.classList.contains('nl-group'), text: row.textContent,
    bar: row.querySelector('.nl-bar-track').getBoundingClientRect().x}));
  return {live, rows, header: panel.querySelector('.nl-header').textContent};
}"""


def run_many(page, server):
    open_notebook(page, server, "many.ipynb")
    run_cell(page, 0)
    cell(page, 0).locator(".jupyter-widgets tr.nl-group.nl-status-running").first.wait_for(timeout=300_000)
    live = page.evaluate(ROWS, 0)
    cell(page, 0).screenshot(path=str(ARTIFACTS / "panel-many-live.png"))
    check_rows(live, "live")
    assert live["live"] and "32 ranks" in live["header"], live["header"]
    release(server, LIVE_SEEN)
    wait_for_text(page, 0, "rank 13 gives up at the end", 300)
    wait_ended(page, 0)
    picture = page.evaluate(ROWS, 0)
    cell(page, 0).screenshot(path=str(ARTIFACTS / "panel-many-picture.png"))
    check_rows(picture, "the final picture")
    assert not picture["live"] and "1 failed" in picture["header"], picture["header"]
    [failed] = [row for row in picture["rows"] if "rank 13 gives up" in row["text"]]
    assert not failed["group"] and failed["text"].startswith("rank 13"), failed


def check_rows(found, when):
    rows = found["rows"]
    assert 1 <= len(rows) <= 10 and any(row["group"] for row in rows), (when, [r["text"][:80] for r in rows])
    starts = {round(row["bar"]) for row in rows}
    assert max(starts) - min(starts) <= 1, (when, starts)   # the bars line up, groups and ranks alike


def test_32_ranks_in_jupyterlab(lab, tmp_path):   # noqa: F811  # the fixture imported above
    write_notebook(tmp_path / "root" / "many.ipynb", [MANY])
    in_browser(lab, run_many, viewport={"width": 1280, "height": 900})
