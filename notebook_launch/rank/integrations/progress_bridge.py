"""Inside a rank, the progress bars users' libraries draw become panel bars: one design for all.

A rank cannot draw into the notebook: tqdm's carriage-return redraws garble the shared
cell, tqdm.notebook and rich's Jupyter Live would make widgets in a process with no
connection to the notebook's widgets (their comm messages are dropped: nothing shows).
So each library gets an *adapter* that patches the library's bar class in place (the
notebook may hold ``from tqdm.auto import tqdm`` or a ``rich.progress.Progress`` from
before the launch) and, at the library's own redraw points, tells a ``Mirror`` the bar's
description, count and total. The mirror forwards the difference to a panel bar
(``rank.reports.progress.Progress``), which batches and throttles like every panel bar: the
library keeps its own counting and throttling, the panel gets what a terminal would show.

Adapters: ``tqdm_bridge`` (tqdm and its variants: tqdm.auto, tqdm.notebook, tqdm.rich,
Lightning's TQDMProgressBar, the Transformers Trainer in a terminal) and ``rich_bridge``
(``rich.progress``: ``track``, ``Progress``, Lightning's default RichProgressBar) and
``transformers_bridge`` (the Trainer's notebook bars, which are HTML, not tqdm).
A library imported after the launch is patched when the rank imports it (``rank.after_import``),
so a rank that never uses it pays nothing.
"""
from __future__ import annotations

import sys
from typing import Any

from ...errors.best_effort import best_effort
from ..reports.progress import Progress


class Mirror:
    """A library bar's twin in the panel. ``sync`` is called at the library's own redraw
    points (tqdm's ``display``, rich's ``update``/``advance``), never per item, so it adds
    nothing to a loop that tqdm or rich do not already spend."""

    __slots__ = ("panel", "raw_desc")

    def __init__(self, desc: str, total: float | None, unit: str = "it", initial: float = 0) -> None:
        self.raw_desc = desc
        self.panel = Progress(None, desc=_plain(desc), total=total, unit=unit, initial=initial)

    def sync(self, desc: str, n: float, total: float | None) -> None:
        panel = self.panel
        if panel.closed:
            return
        if desc != self.raw_desc:
            self.raw_desc = desc
            panel.set_description(_plain(desc))
        if panel.total != total:
            panel.total = total
        if n != panel.n:
            panel.update(n - panel.n)

    def reset(self, total: float | None) -> None:
        self.panel.reset(total=total)

    def close(self) -> None:
        self.panel.close()

    @property
    def closed(self) -> bool:
        return self.panel.closed


def _plain(desc: str) -> str:
    """A description as a person reads it: without tqdm's trailing ': ' and rich's markup."""
    desc = (desc or "").rstrip(": ")
    if "[" in desc and "rich.text" in sys.modules:
        try:
            return str(sys.modules["rich.text"].Text.from_markup(desc).plain)
        except Exception:   # why: not markup after all (a literal '['): show it as it is
            return desc
    return desc


def install(spec: Any = None) -> None:
    """Install every adapter in this rank (a ``runner.rank_hooks`` entry)."""
    import importlib
    for name in ADAPTERS:
        # that library's bars still work, as plain text in the log
        with best_effort("progress adapter %s not installed", name):
            importlib.import_module(f"{__package__}.{name}").install(spec)


ADAPTERS = ("tqdm_bridge", "rich_bridge", "transformers_bridge")
