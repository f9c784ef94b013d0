"""The benchmark page's pictures, drawn from the rows of the same run as the table.

A row that is a point on a curve says so itself (``Row.curve``, ``Row.x``, ``Row.series``:
the launch-cost and result-transfer modules set them), so these plots show exactly the
numbers the table shows: each point is a cell's median, its bar the cell's min to max.
A series with no measured point is left out (a cell that failed or was not measured has
no samples). Written as SVG with matplotlib, byte-stable for the same numbers
(no date, fixed ids), so a rerun that changes nothing changes no file.
Rows with a timeline (item 14's soak: ``Row.timeline``) are drawn apart, each series against
time in a panel of one picture (soak.svg).
"""
from __future__ import annotations

import os
import textwrap
from dataclasses import dataclass, field

from .common import summary


@dataclass(frozen=True)
class Curve:
    """One picture: its file name and what its axes mean."""
    file: str
    title: str
    xlabel: str
    ylabel: str
    note: str = ""


CURVES = {
    "launch_cost": Curve(
        "launch_cost.svg", "Launch cost: a trivial function, call to return",
        "ranks", "call to return (log scale)",
        "warm process; Accelerate runs a 1-rank launch in the calling process"),
    "first_step": Curve(
        "first_step.svg", "Time to the first trained DDP step",
        "ranks", "call to the first step (log scale)",
        "warm process; gloo init, DDP, one forward/backward/step"),
    "result_transfer": Curve(
        "result_transfer.svg", "A rank returns a state_dict: call to return",
        "payload (ranks x state_dict size)", "call to return (log scale)",
        "the memcpy floor copies the same bytes once in the notebook"),
}


@dataclass
class Series:
    """One line of a plot: points sorted by x, each (x, median, min, max)."""
    label: str
    points: list = field(default_factory=list)


def collect(rows, curve: str) -> tuple[list[Series], dict]:
    """The series of ``curve`` from the rows that belong to it, and the x tick labels."""
    by_label: dict[str, Series] = {}
    ticks: dict[float, str] = {}
    for row in rows:
        if row.curve != curve:
            continue
        ticks[row.x] = row.x_tick or f"{row.x:g}"
        for label, cell in row.series.items():
            series = by_label.setdefault(label, Series(label))
            if cell.samples:
                series.points.append((row.x, *summary(cell.samples)))
    found = []
    for series in by_label.values():
        series.points.sort()
        if series.points:
            found.append(series)
    return found, ticks


def seconds_label(value: float, _position: object = None) -> str:
    """A tick on a log axis of seconds, as the table writes times: 0.5 ms, 20 ms, 1 s."""
    if value >= 1:
        return f"{value:g} s"
    return f"{value * 1000:g} ms"


# The figure (inches) and its caption: 9 points like the axes, near-black, wrapped to the figure's width
# (it was 7-point grey lines of 120 characters, hard to read under the plots on the docs' Benchmarks page).
PLOT_WIDTH, PLOT_HEIGHT = 6.4, 4.0
CAPTION_POINTS = 9
CAPTION_COLOR = "#222222"
CAPTION_CHARS = 92          # DejaVu Sans at 9 points: about 4.6 points a character; 92 fit the 461-point width


def caption_lines(caption: str, width: int) -> list[str]:
    """The caption's "; "-separated parts packed into lines of at most ``width`` characters, a part
    broken only where it is longer than a line: "QUICK MODE, do not quote" or a machine's load stays
    on one line, to be read (and found by the smoke test) whole."""
    lines: list[str] = []
    current = ""
    for part in caption.split("; "):
        candidate = f"{current}; {part}" if current else part
        if len(candidate) <= width:
            current = candidate
            continue
        if current:
            lines.append(current + ";")
        pieces = textwrap.wrap(part, width) or [""]
        lines.extend(pieces[:-1])
        current = pieces[-1]
    if current:
        lines.append(current)
    return lines


def draw(series: list[Series], ticks: dict, curve: Curve, path: str, footer: str = "") -> None:
    """One SVG: log-log axes, medians joined by lines, min-max bars, the caption below."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot
    from matplotlib.ticker import FuncFormatter
    caption = "; ".join(part for part in ("median, bars min to max", curve.note, footer) if part)
    lines = caption_lines(caption, CAPTION_CHARS)
    # the caption gets room of its own below the plot: the figure grows by its lines
    caption_inches = (len(lines) * CAPTION_POINTS * 1.3 + 8) / 72
    height = PLOT_HEIGHT + caption_inches
    with matplotlib.rc_context({"svg.hashsalt": "notebook_launch", "svg.fonttype": "none",
                                "font.size": 9}):
        figure, axes = pyplot.subplots(figsize=(PLOT_WIDTH, height))
        try:
            for one in series:
                xs = [p[0] for p in one.points]
                medians = [p[1] for p in one.points]
                below = [p[1] - p[2] for p in one.points]
                above = [p[3] - p[1] for p in one.points]
                axes.errorbar(xs, medians, yerr=[below, above], marker="o", markersize=4, capsize=3,
                              linewidth=1.5, label=one.label)
            axes.set_xscale("log")
            axes.set_yscale("log")
            axes.set_xticks(sorted(ticks))
            axes.set_xticklabels([ticks[x] for x in sorted(ticks)])
            axes.minorticks_off()
            axes.yaxis.set_major_formatter(FuncFormatter(seconds_label))
            axes.set_title(curve.title)
            axes.set_xlabel(curve.xlabel)
            axes.set_ylabel(curve.ylabel)
            axes.grid(True, which="major", alpha=0.3)
            axes.legend(loc="best", fontsize=8)
            _caption_and_save(figure, path, lines, height, caption_inches)
        finally:
            pyplot.close(figure)


def _caption_and_save(figure, path: str, lines: list[str], height: float, caption_inches: float) -> None:
    """The caption under the panels (where and how it was measured), then the SVG, dated by nothing."""
    figure.text(0.01, 4 / 72 / height, "\n".join(lines), fontsize=CAPTION_POINTS, color=CAPTION_COLOR,
                va="bottom", gid="caption")
    figure.tight_layout(rect=(0, caption_inches / height, 1, 1))
    figure.savefig(path, format="svg", metadata={"Date": None})


TIMELINES_FILE = "soak.svg"
TIMELINES_TITLE = "Soak (item 14): each series over the run"


def draw_timelines(rows, path: str, footer: str = "") -> None:
    """One SVG of stacked panels, one per row with a timeline (item 14): its values against minutes
    since the launch, the end of the settling time a dashed line (the goal checks growth after it)."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot
    caption = "; ".join(p for p in ("dashed: where the settling time (the first minute) ends", footer) if p)
    lines = caption_lines(caption, CAPTION_CHARS)
    caption_inches = (len(lines) * CAPTION_POINTS * 1.3 + 8) / 72
    height = 1.7 * len(rows) + 0.6 + caption_inches
    with matplotlib.rc_context({"svg.hashsalt": "notebook_launch", "svg.fonttype": "none", "font.size": 9}):
        figure, panels = pyplot.subplots(len(rows), 1, figsize=(PLOT_WIDTH, height), sharex=True, squeeze=False)
        try:
            for axes, row in zip(panels[:, 0], rows):
                timeline = row.timeline
                axes.plot([t / 60 for t, _ in timeline.points], [v for _, v in timeline.points], marker="o",
                          markersize=3, linewidth=1.5)
                axes.axvline(timeline.settle_s / 60, linestyle="--", color="#888888", linewidth=1)
                axes.set_ylim(0, max(v for _, v in timeline.points) * 1.15 or 1)   # room above the line
                axes.set_title(timeline.label, fontsize=9)
                axes.grid(True, alpha=0.3)
            panels[-1, 0].set_xlabel("minutes since the launch cell ran")
            figure.suptitle(TIMELINES_TITLE)
            _caption_and_save(figure, path, lines, height, caption_inches)
        finally:
            pyplot.close(figure)


def write_plots(rows, out_dir: str, footer: str = "") -> list[str]:
    """Draw every curve the rows hold into ``out_dir``; returns the paths written. A curve
    with nothing to draw (its items not run, or every cell failed) writes no file, so a run
    of some items leaves the other pictures as they were."""
    written = []
    timelines = [row for row in rows if row.timeline is not None and row.timeline.points]
    if timelines:
        os.makedirs(out_dir, exist_ok=True)
        path = os.path.join(out_dir, TIMELINES_FILE)
        draw_timelines(timelines, path, footer)
        written.append(path)
    for name, curve in CURVES.items():
        series, ticks = collect(rows, name)
        if not series:
            continue
        os.makedirs(out_dir, exist_ok=True)
        path = os.path.join(out_dir, curve.file)
        draw(series, ticks, curve, path, footer)
        written.append(path)
    return written
