"""Logged metrics (the data; ``display/curves.py`` draws them): a bounded in-notebook summary,
the full file, and its loader.

Every numeric value a rank logs (``progress.log(loss=...)``, ``set_postfix``,
``update(1, loss=...)``, tqdm's ``set_postfix``) reaches the parent in order. The
parent keeps two things:

- ``Series``: what the panel draws. At most ``CAPACITY`` buckets per metric and
  rank, whatever the number of points: when full, neighbouring buckets merge in
  pairs (keeping count, sum, min and max and the steps of those two), so a million
  points cost 512 buckets; the first and the latest value are kept as they were.
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
    and the width doubles. Memory and drawing cost stay constant; each bucket's
    min and max, and the step each was logged at, survive every merge, so spikes
    stay visible where they happened; the first and the latest value are kept
    exactly (a falling loss's first, highest value is the top of its chart for
    the whole run, not the mean of a bucket that widens as the run goes on).
    """

    __slots__ = ("counts", "first", "last", "latest", "max_steps", "maxs", "min_steps", "mins", "sums", "total",
                 "width")

    def __init__(self) -> None:
        self.width = 1
        self.total = 0               # points seen
        self.counts: list[int] = []
        self.sums: list[float] = []
        self.mins: list[float] = []
        self.maxs: list[float] = []
        self.min_steps: list[int] = []   # the step of each bucket's min (the first, on ties)
        self.max_steps: list[int] = []   # and of its max
        self.last: float | None = None   # the latest value logged, NaN included (the chart's title)
        self.first: tuple[int, float] | None = None    # (step, value) of the first value that is no NaN
        self.latest: tuple[int, float] | None = None   # and of the latest

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
            step = self.total
            self.total += len(chunk)
            self.last = chunk[-1]
            self._fold(index, step, chunk)

    def _fold(self, index: int, step: int, chunk: list[float]) -> None:
        """Add ``chunk`` (logged from ``step`` on) to bucket ``index``. NaN: counted as a step
        (``total``), left out of the values."""
        values = [v for v in chunk if not math.isnan(v)] if any(math.isnan(v) for v in chunk) else chunk
        if not values:
            return
        low, high = min(values), max(values)
        if self.first is None:
            self.first = (step + chunk.index(values[0]), values[0])
        last_at = len(chunk) - 1
        while math.isnan(chunk[last_at]):
            last_at -= 1
        self.latest = (step + last_at, values[-1])
        empty = not self.counts[index]
        if empty or low < self.mins[index]:
            self.mins[index], self.min_steps[index] = low, step + chunk.index(low)
        if empty or high > self.maxs[index]:
            self.maxs[index], self.max_steps[index] = high, step + chunk.index(high)
        self.counts[index] += len(values)
        self.sums[index] += sum(values)

    def _open_bucket(self) -> None:
        self.counts.append(0)
        self.sums.append(0.0)
        self.mins.append(math.inf)
        self.maxs.append(-math.inf)
        self.min_steps.append(-1)
        self.max_steps.append(-1)

    def _merge_pairs(self) -> None:
        half = len(self.counts) // 2
        # of a pair, the later bucket's min (max) wins only when lower (higher), or the earlier is empty
        later_min = [not self.counts[2 * i] or self.mins[2 * i + 1] < self.mins[2 * i] for i in range(half)]
        later_max = [not self.counts[2 * i] or self.maxs[2 * i + 1] > self.maxs[2 * i] for i in range(half)]
        self.mins = [self.mins[2 * i + later_min[i]] for i in range(half)]
        self.min_steps = [self.min_steps[2 * i + later_min[i]] for i in range(half)]
        self.maxs = [self.maxs[2 * i + later_max[i]] for i in range(half)]
        self.max_steps = [self.max_steps[2 * i + later_max[i]] for i in range(half)]
        self.counts = [self.counts[2 * i] + self.counts[2 * i + 1] for i in range(half)]
        self.sums = [self.sums[2 * i] + self.sums[2 * i + 1] for i in range(half)]
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

    def extremes(self) -> list[tuple[int, float]]:
        """(step, value) of real logged points, in step order: the first value, each bucket's
        min and max where they were logged, the latest value (at most 2 * CAPACITY + 2). A line
        through them is the min-max decimation of every value logged (``display/curves.py``)."""
        found: dict[int, float] = {}
        if self.first is not None:
            found[self.first[0]] = self.first[1]
        for i, count in enumerate(self.counts):
            if count:
                found[self.min_steps[i]] = self.mins[i]
                found[self.max_steps[i]] = self.maxs[i]
        if self.latest is not None:
            found[self.latest[0]] = self.latest[1]
        return sorted(found.items())


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
