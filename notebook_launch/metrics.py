"""Logged metrics (the data; ``display/curves.py`` draws them): a bounded in-notebook summary,
the full file, and its loader.

Every numeric value a rank logs (``progress.log(loss=...)``, ``set_postfix``,
``update(1, loss=...)``, tqdm's ``set_postfix``) reaches the parent in order. The
parent keeps two things:

- ``Series``: what the panel draws. At most ``CAPACITY`` buckets per metric and
  rank, whatever the number of points: when full, neighbouring buckets merge in
  pairs (keeping count, sum, min and max), so a million points cost 512 buckets.
- ``metrics.jsonl`` in the run folder: one line per logged value
  (``{"rank": 0, "metric": "loss", "step": 12, "value": 0.5}``), every point at
  full resolution. ``load_metrics(run_dir)`` reads it back for plotting.

``step`` counts the values of one metric on one rank, from 0, in logging order.
"""
from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

from .run_folders import private_open

log = logging.getLogger("notebook_launch")

CAPACITY = 512            # buckets per series; even, so pairs always merge evenly
MAX_SERIES_PER_RANK = 16  # metrics beyond this are still written to the file, not drawn
METRICS_FILE = "metrics.jsonl"
COLUMNS = ("rank", "metric", "step", "value")

_last_run_dir: Path | None = None    # the folder of the latest run started in this process


class Series:
    """One metric of one rank, decimated into at most CAPACITY equal-width buckets.

    Point k (the k-th value logged) lands in bucket ``k // width``; when a new
    bucket would exceed the capacity, every pair of full buckets merges into one
    and the width doubles. Memory and drawing cost stay constant; min and max
    survive every merge, so spikes stay visible.
    """

    __slots__ = ("counts", "last", "maxs", "mins", "sums", "total", "width")

    def __init__(self) -> None:
        self.width = 1
        self.total = 0               # points seen
        self.counts: list[int] = []
        self.sums: list[float] = []
        self.mins: list[float] = []
        self.maxs: list[float] = []
        self.last: float | None = None

    def add(self, value: float) -> None:
        self.extend((value,))

    def extend(self, values: Iterable[float]) -> None:
        """Fold values in logging order; a bucket's slice at a time (sum/min/max run in C)."""
        values = [float(v) for v in values]
        start = 0
        while start < len(values):
            index = self.total // self.width
            if index >= len(self.counts):
                if len(self.counts) >= CAPACITY:
                    self._merge_pairs()
                    continue
                self._open_bucket()
            room = (index + 1) * self.width - self.total
            chunk = values[start:start + room]
            start += len(chunk)
            self.total += len(chunk)
            self.last = chunk[-1]
            if any(math.isnan(v) for v in chunk):   # NaN: counted as a step, left out of the values
                chunk = [v for v in chunk if not math.isnan(v)]
                if not chunk:
                    continue
            self.counts[index] += len(chunk)
            self.sums[index] += sum(chunk)
            self.mins[index] = min(self.mins[index], min(chunk))
            self.maxs[index] = max(self.maxs[index], max(chunk))

    def _open_bucket(self) -> None:
        self.counts.append(0)
        self.sums.append(0.0)
        self.mins.append(math.inf)
        self.maxs.append(-math.inf)

    def _merge_pairs(self) -> None:
        half = len(self.counts) // 2
        self.counts = [self.counts[2 * i] + self.counts[2 * i + 1] for i in range(half)]
        self.sums = [self.sums[2 * i] + self.sums[2 * i + 1] for i in range(half)]
        self.mins = [min(self.mins[2 * i], self.mins[2 * i + 1]) for i in range(half)]
        self.maxs = [max(self.maxs[2 * i], self.maxs[2 * i + 1]) for i in range(half)]
        self.width *= 2

    def __len__(self) -> int:
        return len(self.counts)

    def points(self) -> list[tuple[float, float, float, float]]:
        """(step at the bucket's centre, mean, min, max) of every bucket holding a value."""
        out = []
        for i, count in enumerate(self.counts):
            if count:
                first = i * self.width
                end = min(first + self.width, self.total)
                out.append(((first + end - 1) / 2, self.sums[i] / count, self.mins[i], self.maxs[i]))
        return out


def fold_series(curves: dict[str, Series], series: dict[str, list[int | float]]) -> None:
    """Add a progress event's ``series`` ({metric: [values]}) to a rank's curves."""
    for name, values in series.items():
        curve = curves.get(name)
        if curve is None:
            if len(curves) >= MAX_SERIES_PER_RANK:
                continue
            curve = curves[name] = Series()
        curve.extend(values)


def _json_number(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    if math.isfinite(value):
        return repr(value)
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


class MetricsFile:
    """``metrics.jsonl`` of a run, written by the parent from the ranks' events.
    Opened on the first logged value, so runs that log nothing leave no file."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        global _last_run_dir
        _last_run_dir = Path(folder)
        self.path = Path(folder) / METRICS_FILE
        self._file: IO[str] | None = None
        self._steps: dict[tuple[int, str], int] = {}

    def write(self, rank: int, series: dict[str, list[int | float]]) -> None:
        if not series:
            return
        if self._file is None:
            self._file = private_open(self.path, "a", encoding="utf-8", buffering=1 << 16)
        lines = []
        for name, values in series.items():
            key = (rank, name)
            step = self._steps.get(key, 0)
            prefix = f'{{"rank": {rank}, "metric": {json.dumps(str(name))}, "step": '
            for value in values:
                lines.append(f'{prefix}{step}, "value": {_json_number(value)}}}\n')
                step += 1
            self._steps[key] = step
        self._file.write("".join(lines))

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                log.debug("closing %s failed", self.path, exc_info=True)
            self._file = None


def load_metrics(run_dir: str | os.PathLike[str] | None = None, *, pandas: bool | None = None) -> Any:
    """Every value the ranks logged in a run, at full resolution, for plotting after the run.

    ``run_dir`` is the run folder (the ``logs:`` path the launch prints; ``LaunchError.log_dir``);
    by default the latest run started from this notebook (or process).
    Returns a pandas DataFrame with columns rank, metric, step, value when pandas is
    installed (``pandas=False`` to not use it), else a dict of those four columns as lists.
    E.g. ``df[df.metric == "loss"].pivot(index="step", columns="rank", values="value").plot()``.
    """
    if run_dir is None:
        if _last_run_dir is None:
            raise FileNotFoundError("load_metrics(): no run was started from this process yet; "
                                    "pass the run folder (the 'logs:' path a launch prints)")
        run_dir = _last_run_dir
    path = Path(run_dir).expanduser() / METRICS_FILE
    if not Path(run_dir).expanduser().is_dir():
        raise FileNotFoundError(f"load_metrics: {run_dir} is not a run folder; pass the 'logs:' "
                                f"folder the launch printed (or LaunchError.log_dir)")
    columns: dict[str, list[Any]] = {name: [] for name in COLUMNS}
    if path.exists():
        with open(path, encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except ValueError:   # a run killed mid-write may leave half a line at the end
                    log.debug("skipping an unreadable line of %s", path)
                    continue
                for name in COLUMNS:
                    columns[name].append(row.get(name))
    if pandas is False:
        return columns
    try:
        import pandas as pd
    except ImportError:
        if pandas:
            raise ImportError("load_metrics(pandas=True) needs pandas: pip install pandas") from None
        return columns
    return pd.DataFrame(columns, columns=list(COLUMNS))
