"""Item 14: a compressed day in a real JupyterLab. Does what a long, loud run leaves stay flat?

A notebook in JupyterLab (headless Chromium, driven as tests/test_browser_panel.py drives it) runs
one launch of ``soak_ranks`` ranks at the caps for ``soak_seconds``: each rank prints 200 lines a
second (the per-rank cap of the cell, display/text.py) and logs a metric every step (the panel's
curves), under the default ``ui`` (the widget panel). Every ``soak_sample_seconds`` the harness reads:

- the cell's bytes and the notebook's bytes: JupyterLab saves the notebook (``docmanager:save``, the
  running cell's outputs included) and the file is read: the run cell's outputs as JSON, the file's size;
- widget messages a second: ``comm_msg`` messages the page received over its kernel websocket since
  the last sample (every kernel message is counted by type as it arrives);
- the kernel's resident memory (psutil; the kernel process alone, not its ranks);
- the page's JS heap, live bytes after a collection (DevTools protocol: ``HeapProfiler.collectGarbage``,
  then ``Runtime.getHeapUsage``).

Goal (issue 43, part 6): each series flat after its first minute (``soak_settle_seconds``): its last
value within 10% of its value at the end of that minute (for the message rate, the median of the
last third of the samples against the first third's). Plus the run-folder rows (benchmarks/soak_disk.py).
"""
from __future__ import annotations

import json
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import soak_disk, lab_driver
from .common import fmt_value
from .table import Cell, Row, Timeline

NOTEBOOK = "soak.ipynb"
LINES_PER_SECOND = 200          # each rank's: the cell's per-rank cap (NOTEBOOK_LINES_PER_SECOND)
GROWTH_GOAL = 0.10
DONE = "SOAK DONE"
NOTE = ("Item 14 (benchmarks/soak.py, benchmarks/soak_disk.py): one launch in a real JupyterLab (headless "
        "Chromium, default ui: the widget panel), each rank printing 200 lines a second (the cell's per-rank "
        "cap) and logging a metric every step. Each sample: JupyterLab saves the notebook (the running cell's "
        "outputs included) and the file is read (the run cell's outputs as JSON; the file's size); widget "
        "messages are the comm_msg messages the page received over its kernel websocket; the kernel's RSS is the "
        "kernel process's alone; the JS heap is Runtime.getHeapUsage's used size right after "
        "HeapProfiler.collectGarbage. A row's cell holds the samples after the settling time (the first "
        "minute); growth compares the last value with the first after it (for the message rate, the medians "
        "of the last and first thirds of those samples); the slope is a least-squares fit over them. The "
        "run-folder rows mount a tmpfs as the log root (needs root): one rank prints 1,000-byte lines until "
        "far past the disk's size, then a second small launch applies the retention rule as it starts.")

CELL = """from notebook_launch import notebook_launcher, progress

def soak(seconds, lines_per_second):
    import os, time
    rank = int(os.environ["RANK"])
    period = 1.0 / lines_per_second
    start = time.monotonic()
    deadline = start + seconds
    for step in progress(range(int(seconds * lines_per_second)), desc="soak"):
        loss = 1.0 / (step + 1) + rank * 1e-3
        progress.log(loss=loss, lr=1e-3)
        print(f"rank {{rank}} step {{step}} loss {{loss:.6f}}", flush=True)
        now = time.monotonic()
        if now > deadline:
            break
        behind = now - (start + (step + 1) * period)
        if behind > 1:              # a busy machine: never catch up faster than the cap
            start += behind
        elif behind < 0:
            time.sleep(-behind)
    return rank

results = notebook_launcher(soak, args=({seconds}, {rate}), num_processes={ranks})
print("{done}", results)"""


@dataclass
class Sample:
    """One reading, ``t`` seconds after the launch cell was run."""
    t: float
    cell_bytes: float
    notebook_bytes: float
    comm_messages: int       # since the start, as the page received them
    all_messages: int
    kernel_rss: float
    js_heap: float


@dataclass(frozen=True)
class Series:
    """One row of the table: what is read, its unit, and whether its rate over time is what counts."""
    key: str
    label: str
    unit: str
    scale: float
    rate: bool = False


SERIES = (
    Series("cell_bytes", "the run cell's output in the saved notebook", "kB", 1e-3),
    Series("notebook_bytes", "the saved notebook (file size)", "kB", 1e-3),
    Series("comm_messages", "widget messages a second the page receives (comm_msg)", "msg/s", 1.0, rate=True),
    Series("kernel_rss", "the kernel's resident memory (RSS, the kernel process alone)", "MB", 1e-6),
    Series("js_heap", "the page's JS heap (live bytes after a collection)", "MB", 1e-6),
)


def run(config: dict, log_dir: str, say=print) -> list[Row]:
    return soak_rows(config, say) + soak_disk.run(config, say)


def soak_rows(config: dict, say) -> list[Row]:
    why = lab_driver.missing_tools()
    if why:
        return [failed_row(config, series, f"not measured: {why}") for series in SERIES]
    with tempfile.TemporaryDirectory(prefix="notebook-launch-soak-") as folder:
        try:
            samples, after = soak(config, Path(folder), say)
        except Exception as exc:   # why: one row that says what failed, not a lost benchmark run
            return [failed_row(config, series, f"error: {type(exc).__name__}: {str(exc)[:300]}")
                    for series in SERIES]
    return [series_row(config, series, samples, after) for series in SERIES]


def write_notebook(path: Path, config: dict) -> None:
    import nbformat
    nb = nbformat.v4.new_notebook()
    source = CELL.format(seconds=config["soak_seconds"], rate=LINES_PER_SECOND, ranks=config["soak_ranks"],
                         done=DONE)
    nb.cells = [nbformat.v4.new_code_cell(source)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(path))


def soak(config: dict, folder: Path, say) -> tuple[list[Sample], dict]:
    """Run the soak notebook in JupyterLab; the samples taken while it ran, and what it left after."""
    (folder / "root").mkdir()
    write_notebook(folder / "root" / NOTEBOOK, config)
    with lab_driver.jupyterlab(folder, {"NOTEBOOK_LAUNCH_LOG_DIR": str(folder / "runs")}) as lab, \
            lab_driver.chromium_page() as page:
        counter = lab_driver.MessageCounter()
        counter.watch(page)
        session = page.context.new_cdp_session(page)
        lab_driver.open_notebook(page, lab, NOTEBOOK)
        say(f"item 14: {config['soak_ranks']} ranks at {LINES_PER_SECOND} lines/s each for "
            f"{config['soak_seconds']} s in JupyterLab, sampled every {config['soak_sample_seconds']} s")
        started = time.monotonic()
        lab_driver.run_cell(page, 0)
        samples: list[Sample] = []
        limit = config["soak_seconds"] * 3 + 120     # a busy machine runs late, never this late
        while True:
            tick = started + (len(samples) + 1) * config["soak_sample_seconds"]
            page.wait_for_timeout(max(0.0, tick - time.monotonic()) * 1000)   # the page's events go on
            ended = run_ended(page)
            sample = take_sample(page, session, lab, counter, time.monotonic() - started)
            if ended:
                break
            samples.append(sample)
            if sample.t > limit:
                raise TimeoutError(f"the soak cell still runs after {sample.t:.0f} s")
        text = lab_driver.cell_text(page, 0)
        if DONE not in text:
            raise RuntimeError(f"the soak cell ended without '{DONE}': {text[-500:]!r}")
        rate_limited = "rate exceeded" in lab.log.read_text() or "rate exceeded" in text
    say(f"item 14: {len(samples)} samples; the run took {sample.t:.0f} s")
    return samples, {"after": sample, "rate_limited": rate_limited}


def run_ended(page: Any) -> bool:
    """The launch cell printed its last line, or the kernel is idle again (it failed)."""
    return page.evaluate(
        f"""() => {{ const out = [...document.querySelectorAll('.jp-CodeCell')][0].querySelector('.jp-OutputArea');
        const kernel = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
        return out.textContent.includes('{DONE}') || (kernel.status == 'idle'
            && window.jupyterapp.shell.currentWidget.content.widgets[0].model.executionCount != null); }}""")


def take_sample(page: Any, session: Any, lab: lab_driver.Lab, counter: lab_driver.MessageCounter, t: float) -> Sample:
    lab_driver.save_notebook(page)
    path = lab.root / NOTEBOOK
    saved = json.loads(path.read_text())
    kernels = lab.kernel_processes()
    return Sample(t=t, cell_bytes=len(json.dumps(saved["cells"][0].get("outputs", []))),
                  notebook_bytes=path.stat().st_size, comm_messages=counter.total("comm_msg"),
                  all_messages=counter.total(), kernel_rss=sum(k.memory_info().rss for k in kernels),
                  js_heap=lab_driver.js_heap_bytes(session))


def points(samples: list[Sample], series: Series) -> list[tuple[float, float]]:
    """(seconds, value) in the row's unit; a rate is taken over each interval between samples."""
    if not series.rate:
        return [(s.t, getattr(s, series.key) * series.scale) for s in samples]
    found, before = [], (0.0, 0)
    for s in samples:
        count = getattr(s, series.key)
        if s.t > before[0]:
            found.append((s.t, (count - before[1]) / (s.t - before[0]) * series.scale))
        before = (s.t, count)
    return found


def growth(values: list[float], rate: bool) -> tuple[float, float] | None:
    """(at the start, at the end) of the values after the settling time: the first and last value,
    or for a rate (noisy by nature) the median of the first and of the last third."""
    if len(values) < 2:
        return None
    if not rate:
        return values[0], values[-1]
    third = max(1, len(values) // 3)
    return statistics.median(values[:third]), statistics.median(values[-third:])


def slope_per_minute(after: list[tuple[float, float]]) -> float:
    """Least-squares slope of the values after the settling time, in the row's unit a minute."""
    ts = [t for t, _ in after]
    vs = [v for _, v in after]
    mean_t, mean_v = statistics.fmean(ts), statistics.fmean(vs)
    spread = sum((t - mean_t) ** 2 for t in ts)
    return 60 * sum((t - mean_t) * (v - mean_v) for t, v in after) / spread if spread else 0.0


def measurement(config: dict, series: Series) -> str:
    return (f"soak: {series.label}; {config['soak_ranks']} ranks at the caps ({LINES_PER_SECOND} lines/s each, "
            f"a metric every step) for {config['soak_seconds']} s in JupyterLab, sampled every "
            f"{config['soak_sample_seconds']} s; cell: the values after the first {config['soak_settle_seconds']} s")


def failed_row(config: dict, series: Series, why: str) -> Row:
    row = Row(item="14", measurement=measurement(config, series), ranks=str(config["soak_ranks"]),
              unit=series.unit, group=14, goal=goal_text(config), met="unknown (not measured)")
    row.cells["ours"] = Cell(text=why)
    return row


def goal_text(config: dict) -> str:
    return f"growth after the first {config['soak_settle_seconds']} s ≤ {GROWTH_GOAL:.0%}"


def series_row(config: dict, series: Series, samples: list[Sample], after: dict) -> Row:
    settle = config["soak_settle_seconds"]
    row = failed_row(config, series, "too few samples after the settling time")
    pts = points(samples, series)
    later = [(t, v) for t, v in pts if t >= settle]
    row.timeline = Timeline(points=pts, settle_s=settle, label=f"{series.label} ({series.unit})")
    ends = growth([v for _, v in later], series.rate)
    if ends is None:
        return row
    start, end = ends
    row.cells["ours"] = Cell(samples=[v for _, v in later])
    row.cells["other"] = [Cell(label=f"at {settle} s", text=fmt_value(start, series.unit)),
                          Cell(label="at the end", text=fmt_value(end, series.unit)),
                          Cell(label="peak", text=fmt_value(max(v for _, v in pts), series.unit))]
    row.cells["other"] += extra_anchors(series, samples, after)
    slope = slope_per_minute(later)
    grew = end / start - 1 if start > 0 else None
    row.ratios = (f"end/at {settle} s {end / start:.2f}x; " if start > 0 else "end/start n/a; ") + (
        f"slope {slope / start:+.1%} of it a minute" if start > 0 else f"slope {slope:+.3g} {series.unit}/min")
    row.met = "unknown" if grew is None else ("yes" if grew <= GROWTH_GOAL else "**NO (missed)**")
    return row


def extra_anchors(series: Series, samples: list[Sample], after: dict) -> list[Cell]:
    """What the run left once it ended (its final picture), and the message totals."""
    last: Sample = after["after"]
    if series.key in ("cell_bytes", "notebook_bytes"):
        return [Cell(label="after the run (its final picture)",
                     text=fmt_value(getattr(last, series.key) * series.scale, series.unit))]
    if series.key == "comm_messages":
        every = points(samples, Series("all_messages", "", "msg/s", 1.0, rate=True))
        return [Cell(label="all kernel messages a second, median", text=fmt_value(
                    statistics.median(v for _, v in every), "msg/s") if every else "—"),
                Cell(label="IOPub rate limit hit", text="yes" if after["rate_limited"] else "no")]
    return []
