"""Item 14's verdicts from fixed samples (benchmarks/soak.py): a series that stays flat after the
settling time meets the goal, one that keeps growing misses it, whatever it did in its first minute;
the message rate is taken per interval; the picture has a panel per series. No processes: the soak
itself runs in tests/test_benchmarks_smoke_soak.py."""
from __future__ import annotations

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import plots, soak  # noqa: E402

CONFIG = dict(soak_ranks=8, soak_seconds=120, soak_sample_seconds=10, soak_settle_seconds=60)


def samples(cell_bytes, comm_per_second=20.0, heap=30e6):
    """One sample every 10 s; ``cell_bytes(t)`` gives the cell at time t; widget messages at a steady rate."""
    return [soak.Sample(t=t, cell_bytes=cell_bytes(t), notebook_bytes=cell_bytes(t) + 20_000,
                        comm_messages=int(comm_per_second * t), all_messages=int(comm_per_second * t * 2),
                        kernel_rss=80e6, js_heap=heap) for t in range(10, 130, 10)]


AFTER = {"after": soak.Sample(130, 210_000, 230_000, 0, 0, 80e6, 30e6), "rate_limited": False}


def rows_of(taken):
    return {series.key: soak.series_row(CONFIG, series, taken, AFTER) for series in soak.SERIES}


def test_a_series_flat_after_its_first_minute_meets_the_goal():
    """The cell fills to 200 kB in its first 30 s (the head), then stays: every row meets its goal."""
    rows = rows_of(samples(lambda t: min(t, 30) / 30 * 200_000))
    assert {key: row.met for key, row in rows.items()} == dict.fromkeys(rows, "yes")
    cell = rows["cell_bytes"]
    assert cell.cells["ours"].samples == [200.0] * 7       # the values from 60 s on, in kB
    assert "end/at 60 s 1.00x" in cell.ratios and cell.goal == "growth after the first 60 s ≤ 10%"
    widget = rows["comm_messages"]
    assert widget.cells["ours"].samples == pytest.approx([20.0] * 7)
    assert any(c.label == "IOPub rate limit hit" and c.text == "no" for c in widget.cells["other"])


def test_a_series_that_keeps_growing_misses_it():
    """100 kB at one minute, 1 kB more every second after: 160% more by two minutes."""
    rows = rows_of(samples(lambda t: 100_000 + max(0, t - 60) * 1000))
    assert rows["cell_bytes"].met == "**NO (missed)**" and rows["notebook_bytes"].met == "**NO (missed)**"
    assert "slope +60.0% of it a minute" in rows["cell_bytes"].ratios
    assert rows["kernel_rss"].met == "yes"


def test_too_few_samples_after_the_settling_time_is_no_verdict():
    short = [s for s in samples(lambda t: 1000.0) if s.t <= 60]
    row = soak.series_row(CONFIG, soak.SERIES[0], short, AFTER)
    assert row.met == "unknown (not measured)" and "too few samples" in row.cells["ours"].text


def test_the_soak_picture_has_a_panel_per_series(tmp_path):
    pytest.importorskip("matplotlib")
    rows = list(rows_of(samples(lambda t: 5000.0)).values())
    written = plots.write_plots(rows, str(tmp_path), "2 cores, today")
    assert written == [str(tmp_path / "soak.svg")]
    svg = (tmp_path / "soak.svg").read_text()
    for series in soak.SERIES:
        assert series.label.replace("'", "&#39;") in svg or series.label in svg, series.label
