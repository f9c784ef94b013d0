"""Running ``benchmarks/run.py`` from a test and reading its table (tests/test_benchmarks_smoke*.py)."""
from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMMAND = [sys.executable, os.path.join(ROOT, "benchmarks", "run.py")]


def run_command(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(COMMAND + list(args), cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def table_rows(text: str) -> list[list[str]]:
    """Each data row of the markdown table as a list of cells."""
    lines = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| Item")]
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in lines]
