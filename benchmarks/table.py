"""Rows of the one results table, and how they render as markdown."""
from __future__ import annotations

from dataclasses import dataclass, field

from .common import fmt_samples, summary
from .launchers import LAUNCHERS, TITLES

NOT_AVAILABLE = "not available in this build"
COLUMNS = LAUNCHERS + ("other",)
HEADER = (["Item", "Measurement", "Ranks"] + [TITLES[name] for name in LAUNCHERS]
          + ["Other anchors", "Ratios (medians)", "Goal", "Goal met"])


@dataclass
class Cell:
    samples: list = field(default_factory=list)
    text: str = ""       # instead of samples: "not available in this build", "error: ...", "—"
    label: str = ""      # for the "other" column: what the samples are ("tqdm")

    def median(self):
        return summary(self.samples)[0] if self.samples else None

    def render(self, unit: str) -> str:
        body = fmt_samples(self.samples, unit) if self.samples else (self.text or "—")
        return f"{self.label}: {body}" if self.label else body


@dataclass
class Timeline:
    """A row's values over time (item 14's soak), drawn by benchmarks/plots.py: (seconds, value)
    points, and when the settling time ends (the growth after it is what the row's goal checks)."""
    points: list = field(default_factory=list)
    settle_s: float = 0.0
    label: str = ""


@dataclass
class Row:
    item: str
    measurement: str
    ranks: str
    unit: str
    cells: dict = field(default_factory=dict)     # column -> Cell, or list of Cells for "other"
    ratios: str = ""
    goal: str = "— (curve)"
    met: str = "—"
    group: int = 0          # table order: launch cost, first step, progress, widget, memory
    condition: str = ""     # "warm" or "fresh" for launch-cost rows
    # The row as a point on a plot (benchmarks/plots.py): which curve, where on the x axis, and
    # which of its cells (the table's own Cell objects) are the plotted series, by legend label.
    curve: str = ""
    x: float = 0.0
    x_tick: str = ""
    series: dict = field(default_factory=dict)
    timeline: Timeline | None = None     # a series over time instead (benchmarks/soak.py)

    def cell(self, column: str) -> Cell:
        return self.cells.setdefault(column, Cell())

    def median(self, column: str):
        value = self.cells.get(column)
        return value.median() if isinstance(value, Cell) else None

    def render(self) -> str:
        parts = [self.item, self.measurement, self.ranks]
        for column in LAUNCHERS:
            value = self.cells.get(column)
            parts.append(value.render(self.unit) if value else "—")
        others = self.cells.get("other") or []
        parts.append("; ".join(c.render(self.unit) for c in others) or "—")
        parts += [self.ratios or "—", self.goal, self.met]
        return "| " + " | ".join(p.replace("|", "\\|") for p in parts) + " |"


def ratio(numerator, denominator):
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


def fmt_ratio(value) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def render_table(rows) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += [row.render() for row in rows]
    return "\n".join(lines)
