"""Item 14's run-folder rows: a rank that prints far more than its log folder's disk holds keeps
working, and the run folders' retention still holds afterwards.

A tmpfs of ``disk_mb`` (a real 'No space left on device'; needs root and mount) is the log root
(``NOTEBOOK_LAUNCH_LOG_DIR``), retention bounded at ``keep_mb`` (``NOTEBOOK_LAUNCH_KEEP_MB``). In a
fresh Python, one rank prints ``total_mb`` of 1,000-byte lines: the disk fills, the logging stops
(said once) and the rank runs on to return its result. A second, small launch follows: as it starts,
retention removes the full run's folder (over the bound), and its own log holds every line it
printed. The same behaviour is tested, at small sizes, by tests/test_log_degrade.py
(test_a_full_disk_stops_logging_not_the_run, test_a_full_default_root_is_still_bounded_when_the_run_falls_back).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from .common import REPO_ROOT
from .table import Cell, Row

LINE_BYTES = 1000          # each printed line with its newline
NEXT_RUN_LINES = 2000
STOPPED_NOTE = "stopped writing the logs"

SCRIPT = """
import json, sys, time
from notebook_launch import notebook_launcher

def loud(lines):
    line = "x" * 999
    for _ in range(lines):
        print(line)
    return lines

lines, report = int(sys.argv[1]), sys.argv[2]
started = time.monotonic()
first = notebook_launcher(loud, args=(lines,), num_processes=1)
took = time.monotonic() - started
second = notebook_launcher(loud, args=({next_lines},), num_processes=1)
with open(report, "w") as f:
    json.dump({{"first": first, "took": took, "second": second}}, f)
"""


def folder_bytes(folder: Path) -> int:
    """Bytes a folder takes on disk (allocated blocks, as the retention rule counts them)."""
    return sum(p.stat().st_blocks * 512 for p in folder.rglob("*") if p.is_file())


def run(config: dict, say=print) -> list[Row]:
    disk_mb, total_mb = config["soak_disk_mb"], config["soak_log_mb"]
    with tempfile.TemporaryDirectory(prefix="notebook-launch-soak-disk-") as folder:
        disk = Path(folder) / "disk"
        disk.mkdir()
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={disk_mb}m", "tmpfs", str(disk)],
                                 capture_output=True, text=True)
        if mounted.returncode != 0:
            why = f"not measured: cannot mount a tmpfs here ({mounted.stderr.strip() or mounted.returncode})"
            return rows(config, None, Cell(text=why), Cell(text=why))
        try:
            say(f"item 14: one rank prints {total_mb} MB into a log folder on a {disk_mb} MB tmpfs")
            return measure(config, Path(folder), disk)
        finally:
            subprocess.run(["umount", "-l", str(disk)], check=False)


def measure(config: dict, folder: Path, disk: Path) -> list[Row]:
    runs, report = disk / "runs", folder / "report.json"
    env = dict(os.environ, NOTEBOOK_LAUNCH_LOG_DIR=str(runs), NOTEBOOK_LAUNCH_KEEP_MB=str(config["soak_keep_mb"]),
               PYTHONPATH=REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    lines = config["soak_log_mb"] * 10**6 // LINE_BYTES
    with open(folder / "out.txt", "w") as out:
        done = subprocess.run([sys.executable, "-c", SCRIPT.format(next_lines=NEXT_RUN_LINES), str(lines),
                               str(report)], env=env, stdout=out, stderr=subprocess.STDOUT, timeout=1800)
    text = (folder / "out.txt").read_text(errors="replace")
    if done.returncode != 0 or not report.exists():
        why = Cell(text=f"error: exit {done.returncode}: {text[-300:]!r}")
        return rows(config, None, why, why)
    result = json.loads(report.read_text())
    folders = sorted(p for p in runs.iterdir() if p.is_dir() and not p.name.startswith("."))
    remaining = sum(folder_bytes(p) for p in folders)
    next_log = sum(bytes_the_rank_wrote(p) for p in folders[-1].glob("rank*")) if folders else 0
    facts = {"returned": result["first"] == [lines] and result["second"] == [NEXT_RUN_LINES],
             "said": text.count(STOPPED_NOTE), "folders": len(folders),
             "next_log": next_log, "next_expected": NEXT_RUN_LINES * LINE_BYTES}
    return rows(config, facts, Cell(samples=[result["took"]]), Cell(samples=[remaining / 1e6]))


def bytes_the_rank_wrote(log: Path) -> int:
    """The bytes of a rank's log its own lines take: not the notebook's lines about the rank's
    resources (``[notebook_launch] resources``: one as it ends, one a minute before)."""
    with open(log, "rb") as f:
        return sum(len(line) for line in f if not line.startswith(b"[notebook_launch] resources"))


def rows(config: dict, facts: dict | None, took: Cell, remaining: Cell) -> list[Row]:
    disk_mb, keep_mb, total_mb = config["soak_disk_mb"], config["soak_keep_mb"], config["soak_log_mb"]
    full = Row(item="14", ranks="1", unit="s", group=15, goal="returns its result; the stop said once",
               measurement=f"soak, run folder: a rank prints {total_mb:,} MB of lines, its log folder on a "
                           f"{disk_mb} MB disk that fills (call to return)")
    kept = Row(item="14", ranks="1", unit="MB", group=15,
               goal=f"≤ {keep_mb} MB, and the next run logs every line",
               measurement=f"soak, run folder: what the run folders take after the next launch "
                           f"(retention bound NOTEBOOK_LAUNCH_KEEP_MB={keep_mb})")
    full.cells["ours"], kept.cells["ours"] = took, remaining
    if facts is None:
        full.met = kept.met = "unknown (not measured)"
        return [full, kept]
    full.cells["other"] = [Cell(label="'stopped writing the logs' said", text=f"{facts['said']} time(s)")]
    kept.cells["other"] = [Cell(label="run folders left", text=str(facts["folders"])),
                           Cell(label="the next run's log", text=f"{facts['next_log']:,} of "
                                                                 f"{facts['next_expected']:,} bytes")]
    full.met = "yes" if facts["returned"] and facts["said"] == 1 else "**NO (missed)**"
    bounded = remaining.samples and remaining.samples[0] <= keep_mb
    kept.met = "yes" if bounded and facts["next_log"] >= facts["next_expected"] else "**NO (missed)**"
    return [full, kept]
