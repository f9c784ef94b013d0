"""The benchmark command's item 13 (spawn-class starts: the warm start process beside fork, torch's
spawn and elastic's spawn) keeps working: run once at its smallest sizes and check its rows. A module
of its own so that a second test worker runs it beside tests/test_benchmarks_smoke.py. No timings are
asserted (benchmarks report speed; tests check behaviour)."""
from __future__ import annotations

import pytest

from helpers.benchmark_runs import run_command, table_rows


@pytest.fixture(scope="module")
def quick_results(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench13") / "RESULTS.md"
    done = run_command("--quick", "--repeats", "1", "--only", "13", "--out", str(out), "--plots", "")
    assert done.returncode == 0, f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"
    return out.read_text()


@pytest.mark.timeout(1200)
def test_spawn_class_rows_put_the_start_process_beside_fork_and_torchs_spawn(quick_results):
    """Item 13 (issue 41): our spawn-class start against our fork, our fresh-Python spawn, torch's
    spawn and elastic's spawn, warm and fresh, and the start process's memory; no cell failed."""
    rows = [cells for cells in table_rows(quick_results) if cells[0] == "13"]
    timed = [cells for cells in rows if "call to return" in cells[1] or "first trained step" in cells[1]]
    # trivial warm and fresh, first step warm (quick mode leaves out the first step in fresh processes)
    assert len(timed) == 3, quick_results
    for cells in timed:
        assert "n=1" in cells[3] and "ours, fork:" in cells[7], cells
        assert "ours spawn-class/ours fork" in cells[8] and cells[10] in ("yes", "**NO (missed)**", "—"), cells
        if "trivial" in cells[1]:
            assert "ours, spawn as fresh Pythons (start process off):" in cells[7], cells
    warm_trivial = next(c for c in timed if "warm process" in c[1] and "trivial" in c[1])
    assert "torch start_processes (spawn):" in warm_trivial[7] and "elastic_launch (spawn):" in warm_trivial[7]
    assert warm_trivial[9] == "ours/fork ≤ 1.5x and torch spawn/ours ≥ 20x"
    memory = [cells for cells in rows if "resident memory" in cells[1]]
    assert len(memory) == 1 and "MB" in memory[0][3], rows
    assert not any("error:" in cell for cells in rows for cell in cells), quick_results
