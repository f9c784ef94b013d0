"""The benchmark command's item 14 (the soak: a long, loud launch in a real JupyterLab, and a rank
filling its log folder's disk) keeps working: run once in quick mode (2 ranks for 25 s, a 32 MB log on a
16 MB disk: benchmarks/run.py's SOAK_QUICK) and check that every series has its row, its samples and its
picture. A module of its own so that a test worker runs it beside the other smoke runs. No flatness is
asserted: a quick run's 15 s after settling say little, and benchmarks report; tests check behaviour
(tests/test_cell_budget.py checks the bound itself)."""
from __future__ import annotations

import os
import shutil
import sys

import pytest

from helpers.benchmark_runs import ROOT, run_command, table_rows

sys.path.insert(0, ROOT)
from benchmarks.run import SOAK_QUICK  # noqa: E402

pytestmark = [
    pytest.mark.skipif(not os.path.exists(shutil.which("chromium") or "/usr/bin/chromium"),
                       reason="needs Debian's chromium: bash scripts/system-packages.sh"),
    pytest.mark.timeout(600),
]

SERIES = ("the run cell's output in the saved notebook", "the saved notebook (file size)",
          "widget messages a second", "the kernel's resident memory", "the page's JS heap")


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    pytest.importorskip("playwright")
    pytest.importorskip("jupyterlab")
    folder = tmp_path_factory.mktemp("bench14")
    out, plots = folder / "RESULTS.md", folder / "plots"
    done = run_command("--quick", "--repeats", "1", "--only", "14", "--out", str(out), "--plots", str(plots),
                       timeout=540)
    assert done.returncode == 0, f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"
    return out.read_text(), plots


def test_every_soak_series_has_a_row_with_its_samples_and_a_verdict(quick_run):
    text, _ = quick_run
    rows = [cells for cells in table_rows(text) if cells[0] == "14"]
    for name in SERIES:
        found = [cells for cells in rows if name in cells[1]]
        assert len(found) == 1, (name, text)
        cells = found[0]
        assert "n=" in cells[3] and "at the end:" in cells[7] and "slope" in cells[8], cells
        assert cells[9] == f"growth after the first {SOAK_QUICK['soak_settle_seconds']} s ≤ 10%", cells
        assert cells[10] in ("yes", "**NO (missed)**"), cells
    widget = next(cells for cells in rows if "widget messages" in cells[1])
    assert "IOPub rate limit hit:" in widget[7], widget


def test_the_run_folder_rows_say_the_run_returned_and_retention_held(quick_run):
    text, _ = quick_run
    rows = [cells for cells in table_rows(text) if cells[0] == "14" and "run folder" in cells[1]]
    assert len(rows) == 2, text
    if "cannot mount a tmpfs" in rows[0][3]:
        pytest.skip(rows[0][3])
    full, kept = rows
    assert f"{SOAK_QUICK['soak_log_mb']} MB of lines" in full[1], full
    assert "'stopped writing the logs' said: 1 time(s)" in full[7], full
    assert full[10] == "yes" and kept[10] == "yes", rows   # the behaviour itself, not a speed
    assert "the next run's log: 2,000,000 of 2,000,000 bytes" in kept[7], kept


def test_the_soak_picture_has_a_panel_per_series(quick_run):
    _, plots = quick_run
    svg = (plots / "soak.svg").read_text()
    assert "QUICK MODE" in svg
    for name in SERIES:
        assert name.replace("'", "&#39;") in svg or name in svg, name
