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


def quick_module_rows(module: str, out: str, item: str, timeout: float) -> list[list[str]]:
    """Run a benchmark that has its own command (``python -m benchmarks.<module>``: it needs its own
    cluster) once at its smallest, and the rows of ``item`` in the page it wrote to ``out``."""
    done = subprocess.run([sys.executable, "-m", f"benchmarks.{module}", "--quick", "--repeats", "1", "--out", out],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"
    with open(out) as page:
        return [cells for cells in table_rows(page.read()) if cells[0] == item]
