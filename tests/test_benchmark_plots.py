"""The benchmark plots are drawn from the table's own rows: fixed numbers in, the same numbers
on the curves and in the SVGs out (no timing: benchmarks report speed, tests check behaviour)."""
from __future__ import annotations

import os
import sys
import xml.etree.ElementTree as ElementTree

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

pytest.importorskip("matplotlib")

from benchmarks import launch_cost, plots, result_transfer  # noqa: E402
from benchmarks.table import Cell  # noqa: E402

# seconds per launcher at 1, 2, 4 and 8 ranks: three samples each (min, median, max)
TRIVIAL = {"ours": [0.018, 0.027, 0.044, 0.078], "accelerate": [0.0002, 0.127, 0.143, 0.176],
           "start_processes": [0.011, 0.019, 0.028, 0.057], "elastic": [0.117, 0.126, 0.141, 0.178]}


def samples_around(median):
    return [median * 0.9, median, median * 1.2]


def launch_rows(workload="trivial", broken=()):
    rows = []
    for index, ranks in enumerate((1, 2, 4, 8)):
        cells = {name: Cell(text="error: boom") if name in broken else Cell(samples=samples_around(values[index]))
                 for name, values in TRIVIAL.items()}
        rows.append(launch_cost.make_row(workload, "warm", ranks, cells,
                                         launch_cost.goal_item_for(workload, ranks, "warm")))
    # a fresh-process row is no point on the rank-count curve
    rows.append(launch_cost.make_row(workload, "fresh", 2, {n: Cell(samples=[9.0]) for n in TRIVIAL}, "1"))
    return rows


def transfer_rows():
    rows = []
    for mib, ranks, seconds in ((64, 1, 0.069), (256, 1, 0.201), (1024, 1, 0.678), (1024, 2, 1.60)):
        reply = {"seconds": seconds, "read_seconds": 0.01, "notebook_extra": mib * 2**20 * ranks,
                 "rank_extra": [mib * 2**20] * ranks}
        samples = {"ours": [reply], "baseline": [{"seconds": seconds / 2}],
                   "queue": [dict(reply, seconds=seconds * 1.5)], "memcpy": [dict(reply, seconds=seconds / 5)],
                   "persistent": [dict(reply, seconds=seconds * 0.8)], "persistent_baseline": [{"seconds": 0.01}],
                   "push_pull": [{"push_seconds": 0.1, "push_baseline": 0.001, "push_extra": 1,
                                  "pull_seconds": 0.1, "pull_baseline": 0.001, "pull_extra": 1}]}
        rows += result_transfer._rows(mib, ranks, samples, {})
        rows += result_transfer._persistent_rows(mib, ranks, samples, {})
    return rows


def test_launch_cost_curves_are_the_tables_medians_against_rank_count():
    series, ticks = plots.collect(launch_rows(), "launch_cost")
    by_label = {one.label: one for one in series}
    assert set(by_label) == {"This project", "Accelerate notebook_launcher", "torch start_processes (fork)"}
    ours = by_label["This project"].points
    assert [p[0] for p in ours] == [1, 2, 4, 8], "one point per rank count; the fresh row is no point"
    assert [p[1] for p in ours] == pytest.approx(TRIVIAL["ours"])
    assert [p[2] for p in ours] == pytest.approx([m * 0.9 for m in TRIVIAL["ours"]])
    assert [p[3] for p in ours] == pytest.approx([m * 1.2 for m in TRIVIAL["ours"]])
    assert ticks == {1: "1", 2: "2", 4: "4", 8: "8"}


def test_a_launcher_whose_cells_failed_draws_no_curve():
    series, _ = plots.collect(launch_rows("first_step", broken=("accelerate",)), "first_step")
    assert {one.label for one in series} == {"This project", "torch start_processes (fork)"}


def test_result_transfer_curve_has_ours_the_queue_and_the_memcpy_floor_against_size():
    series, ticks = plots.collect(transfer_rows(), "result_transfer")
    by_label = {one.label: one for one in series}
    assert set(by_label) == {"This project (notebook_launcher)", "This project, persistent ranks (ranks.run)",
                             "torch.multiprocessing Queue (fork)", "memcpy of the same bytes (the floor)"}
    assert [p[0] for p in by_label["memcpy of the same bytes (the floor)"].points] == [64, 256, 1024, 2048]
    assert [p[1] for p in by_label["This project (notebook_launcher)"].points] == pytest.approx(
        [0.069, 0.201, 0.678, 1.60])
    assert ticks == {64: "64 MiB", 256: "256 MiB", 1024: "1 GiB", 2048: "2 x 1 GiB"}


def test_write_plots_writes_an_svg_per_curve_with_its_labels(tmp_path):
    rows = launch_rows() + launch_rows("first_step") + transfer_rows()
    written = plots.write_plots(rows, str(tmp_path / "images"), footer="2 cores, test numbers")
    assert sorted(os.path.basename(p) for p in written) == ["first_step.svg", "launch_cost.svg",
                                                            "result_transfer.svg"]
    for path in written:
        text = open(path).read()
        ElementTree.fromstring(text)   # well-formed SVG
        caption = " ".join(_captions(text)[0])   # its lines wrap where they must
        assert "2 cores, test numbers" in caption and "median, bars min to max" in caption
    launch = open(tmp_path / "images" / "launch_cost.svg").read()
    for label in ("This project", "Accelerate notebook_launcher", "torch start_processes (fork)",
                  plots.CURVES["launch_cost"].title):
        assert label in launch
    assert "memcpy of the same bytes (the floor)" in open(tmp_path / "images" / "result_transfer.svg").read()


def test_the_same_numbers_draw_the_same_bytes(tmp_path):
    """No date and fixed ids: a rerun that changes no number changes no committed picture."""
    first = plots.write_plots(launch_rows(), str(tmp_path / "a"))
    second = plots.write_plots(launch_rows(), str(tmp_path / "b"))
    assert [open(p, "rb").read() for p in first] == [open(p, "rb").read() for p in second]


def test_curves_with_nothing_to_draw_write_no_file(tmp_path):
    """A run of some items (--only 8) leaves the other pictures as they were."""
    written = plots.write_plots(transfer_rows(), str(tmp_path))
    assert [os.path.basename(p) for p in written] == ["result_transfer.svg"]
    assert sorted(os.listdir(tmp_path)) == ["result_transfer.svg"]
    assert plots.write_plots(launch_rows(broken=tuple(TRIVIAL)), str(tmp_path / "none")) == []


def _captions(svg_text):
    """The caption lines of one SVG and their font size and colour (the text elements of <g id="caption">)."""
    ns = {"svg": "http://www.w3.org/2000/svg"}
    root = ElementTree.fromstring(svg_text)
    group = root.find(".//svg:g[@id='caption']", ns)
    assert group is not None, "no <g id='caption'> in the SVG"
    texts = group.findall("svg:text", ns)
    styles: list[dict[str, str]] = []
    for t in texts:
        pairs = [part.split(": ", 1) for part in (t.get("style") or "").split("; ")]
        styles.append({pair[0]: pair[1] for pair in pairs})
    return [t.text for t in texts], styles, float((root.get("viewBox") or "").split()[2])


def _readable(lines, styles, width):
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import TextToPath
    assert lines and all(style["font-size"] == f"{plots.CAPTION_POINTS}px" for style in styles), styles
    assert plots.CAPTION_POINTS >= 9 and all(style["fill"] == plots.CAPTION_COLOR for style in styles), styles
    measure = TextToPath()
    font = FontProperties(family="DejaVu Sans", size=plots.CAPTION_POINTS)
    widths = [measure.get_text_width_height_descent(line, font, ismath=False)[0] for line in lines]
    assert max(widths) <= width * 0.98, f"a caption line is wider than the figure: {list(zip(lines, widths))}"


def test_the_caption_under_a_plot_is_readable_and_fits(tmp_path):
    """Issue 35: the captions were 7-point grey lines of 120 characters under the plots."""
    footer = "2 usable of 2 cores, AMD EPYC 7B13 64-Core Processor, torch 2.13.0+cpu, 2026-11-24 10:25 UTC, n=5"
    for path in plots.write_plots(launch_rows() + transfer_rows(), str(tmp_path), footer=footer):
        lines, styles, width = _captions(open(path, encoding="utf-8").read())
        _readable(lines, styles, width)
        assert " ".join(lines).endswith("n=5"), lines    # all of it, nothing cut off


def test_the_docs_plots_have_readable_captions():
    folder = os.path.join(ROOT, "docs", "images", "benchmarks")
    for name in sorted(os.listdir(folder)):
        if name.endswith(".svg"):
            _readable(*_captions(open(os.path.join(folder, name), encoding="utf-8").read()))
