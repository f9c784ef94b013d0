"""The benchmark command keeps working: run every item once at its smallest sizes (--quick
--repeats 1) and check the table has every row, filled in, and the plots are drawn. No timings
are asserted (benchmarks report speed; tests check behaviour).

Item 9 (a two-node Ray cluster in network namespaces, Ray Train's TorchTrainer beside it) takes
minutes before its first number, so it is opt-in: NOTEBOOK_LAUNCH_BENCHMARK_RAY=1 runs it
(tests/raycluster checks the launches it times, in the main suite). Likewise the SLURM rows beside
submitit (benchmarks/slurm_cluster.py, a two-node SLURM in network namespaces):
NOTEBOOK_LAUNCH_BENCHMARK_SLURM=1 runs them."""
from __future__ import annotations

import os
import xml.etree.ElementTree as ElementTree

import pytest

from helpers.benchmark_runs import quick_module_rows, run_command, table_rows

# Item 13 (spawn-class starts) runs in a module of its own (tests/test_benchmarks_smoke_spawn.py), so another
# test worker runs it beside this one: one run of every item took 8 minutes of one worker in CI.
EVERY_ITEM_BUT_RAY = "1,2,3,4,5,6,7,8,10,11"


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bench")
    out, plots = folder / "RESULTS.md", folder / "plots"
    done = run_command("--quick", "--repeats", "1", "--only", EVERY_ITEM_BUT_RAY, "--out", str(out),
                       "--plots", str(plots))
    assert done.returncode == 0, f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"
    return out.read_text(), plots


@pytest.fixture(scope="module")
def quick_results(quick_run):
    return quick_run[0]


@pytest.mark.timeout(1200)
def test_results_start_with_the_machine_and_the_command(quick_results):
    head = quick_results.split("| Item", 1)[0]
    for field in ("date:", "cores:", "memory:", "python:", "torch:", "accelerate:",
                  "Command: `python benchmarks/run.py"):
        assert field in head, f"{field!r} missing from the header:\n{head}"
    assert "QUICK MODE" in quick_results


@pytest.mark.timeout(1200)
def test_the_same_run_draws_the_plots_and_the_table_names_them(quick_run):
    text, plots = quick_run
    names = ("launch_cost.svg", "first_step.svg", "result_transfer.svg")
    assert sorted(os.listdir(plots)) == sorted(names)
    for name in names:
        svg = (plots / name).read_text()
        ElementTree.fromstring(svg)
        assert "This project" in svg and "QUICK MODE" in svg, name
        assert f"[{name}](plots/{name})" in text, "RESULTS.md links each plot"
    assert "torch start_processes (fork)" in (plots / "first_step.svg").read_text()
    assert "memcpy of the same bytes (the floor)" in (plots / "result_transfer.svg").read_text()


@pytest.mark.timeout(1200)
def test_table_has_every_item_and_every_launcher_measured(quick_results):
    rows = table_rows(quick_results)
    by_key = {}
    for cells in rows:
        item, measurement, ranks = cells[:3]
        condition = "fresh" if "fresh" in measurement else "spawn" if measurement.endswith("spawn") else "main"
        by_key[(item, condition, ranks)] = cells
    expected = {("6", "main", "1"), ("1", "main", "2"), ("1", "fresh", "2"), ("2", "main", "2"),
                ("2", "fresh", "2"), ("3", "main", "1"), ("4", "main", "8"), ("5", "main", "2"),
                ("5", "spawn", "2"), ("8", "main", "1"), ("8", "main", "2"), ("11", "main", "2")}
    assert expected <= set(by_key), f"missing rows: {expected - set(by_key)}\n{quick_results}"
    assert all(len(cells) == 11 for cells in rows), "every row has the 11 columns of the header"
    # Items 1 and 2: this project and Accelerate measured side by side; no cell failed.
    for key in [("1", "main", "2"), ("1", "fresh", "2"), ("2", "main", "2"), ("2", "fresh", "2")]:
        ours, accelerate = by_key[key][3], by_key[key][4]
        assert "n=1" in ours and "n=1" in accelerate, by_key[key]
        assert "Accelerate/ours" in by_key[key][8] and by_key[key][10] in ("yes", "**NO (missed)**")
    for key in [("6", "main", "1"), ("1", "main", "2")]:
        assert "n=1" in by_key[key][5] and "n=1" in by_key[key][6], "start_processes and elastic measured"
    assert "n=1" in by_key[("2", "main", "2")][5], "start_processes' first step measured"
    assert "bare loop:" in by_key[("3", "main", "1")][7] and "tqdm:" in by_key[("3", "main", "1")][7]
    assert "/s on average" in by_key[("4", "main", "8")][3], "item 4 measured, not pointed elsewhere"
    fork_memory = by_key[("5", "main", "2")]
    assert "MB" in fork_memory[3] and "calibration" in fork_memory[7]
    assert "MB" in by_key[("5", "spawn", "2")][3], "spawn memory measured now that spawn exists"
    kernel_rows = [cells for cells in rows if cells[0] == "10"]   # first launch in fresh Jupyter kernels
    assert len(kernel_rows) == 2, kernel_rows   # quick: the trivial function and the first step, Run All
    assert all("n=1" in cells[3] and "n=1" in cells[4] and "Accelerate/ours" in cells[8]
               for cells in kernel_rows), kernel_rows
    assert not any("error:" in cell for cells in rows for cell in cells), quick_results


@pytest.mark.timeout(1200)
def test_result_transfer_rows_compare_ours_with_the_queue_and_the_memcpy_floor(quick_results):
    rows = [cells for cells in table_rows(quick_results) if cells[0] == "8" and "state_dict" in cells[1]]
    timed = [cells for cells in rows if "call to return" in cells[1]]
    memory = [cells for cells in rows if "peak extra memory" in cells[1]]
    assert len(timed) == len(memory) == 2 and {cells[2] for cells in timed} == {"1", "2"}, quick_results
    for cells in timed:
        assert "n=1" in cells[3], cells
        for label in ("torch.multiprocessing Queue (fork):", "memcpy of the same bytes in the notebook:",
                      "ours, then reading every byte once:", "ours, same launch returning None:"):
            assert label in cells[7] and "n=1" in cells[7].split(label)[1].split(";")[0], cells
        assert "ours/memcpy" in cells[8] and "s per GiB" in cells[8]
    two_ranks = next(cells for cells in timed if cells[2] == "2")
    assert two_ranks[9] == "transfer/memcpy ≤ 2x" and two_ranks[10] in ("yes", "**NO (missed)**")
    for cells in memory:
        assert cells[3].startswith("notebook ") and "rank " in cells[3], cells
        assert "Queue (fork): notebook " in cells[7] and "ours/payload: notebook" in cells[8], cells
    two_ranks = next(cells for cells in memory if cells[2] == "2")
    assert two_ranks[9] == "≤ 1.1 x payload, each side" and two_ranks[10] in ("yes", "**NO (missed)**")


@pytest.mark.timeout(1200)
def test_result_transfer_has_persistent_rows_both_ways(quick_results):
    """Item 8, persistent ranks (issue 23): a call's result, a push and a pull, each against
    a memcpy, and the notebook's memory for all three."""
    rows = [cells for cells in table_rows(quick_results) if cells[0] == "8" and "persistent ranks:" in cells[1]]
    for what in ("`ranks.run` returns", "`ranks.push` of", "`ranks.pull` of"):
        timed = [cells for cells in rows if what in cells[1]]
        assert {cells[2] for cells in timed} == {"1", "2"}, quick_results
        for cells in timed:
            assert "n=1" in cells[3] and "memcpy of the same bytes" in cells[7] and "transfer/memcpy" in cells[8]
        two_ranks = next(cells for cells in timed if cells[2] == "2")
        assert two_ranks[9] == "transfer/memcpy ≤ 2x" and two_ranks[10] in ("yes", "**NO (missed)**")
    memory = [cells for cells in rows if "highest memory" in cells[1]]
    assert len(memory) == 2 and all("run " in c[3] and "push " in c[3] and "pull " in c[3] for c in memory)
    two_ranks = next(cells for cells in memory if cells[2] == "2")
    assert two_ranks[9] == "≤ 1.1 x payload, each side" and two_ranks[10] in ("yes", "**NO (missed)**")


@pytest.mark.timeout(1200)
def test_result_transfer_has_numpy_and_bytes_rows_beside_pickle_and_memcpy(quick_results):
    """Item 8, numpy and bytes results (issue 32 item 5): each against a plain pickle round trip
    and a memcpy of the same bytes, and the notebook's memory against the round trip's."""
    rows = [cells for cells in table_rows(quick_results) if cells[0] == "8"]
    for shape in ("8 float32 numpy arrays in a dict", "one bytes object"):
        timed = [cells for cells in rows if shape in cells[1] and "call to return" in cells[1]]
        memory = [cells for cells in rows if shape in cells[1] and "peak extra memory" in cells[1]]
        assert {cells[2] for cells in timed} == {cells[2] for cells in memory} == {"1", "2"}, quick_results
        for cells in timed:
            assert "n=1" in cells[3], cells
            for label in ("pickle.loads(pickle.dumps(v)) in the notebook:",
                          "numpy.copy of the same bytes in the notebook:", "ours, same launch returning None:",
                          "ours, then reading every byte once:"):
                assert label in cells[7] and "n=1" in cells[7].split(label)[1].split(";")[0], cells
            assert "/pickle round trip" in cells[8] and "transfer/memcpy" in cells[8], cells
        for cells in memory:
            assert cells[3].startswith("notebook ") and "rank " in cells[3], cells
            assert "pickle round trip in the notebook: notebook " in cells[7], cells
            assert "/payload: notebook" in cells[8] and "pickle round trip" in cells[8], cells


def test_bad_arguments_name_the_argument_and_the_valid_values():
    done = run_command("--only", "1,99", timeout=120)   # 99 names no item
    assert done.returncode == 2 and "--only" in done.stderr and "1,2,3,4,5,6,7,8,9,10,11,12,13" in done.stderr
    done = run_command("--repeats", "0", timeout=120)
    assert done.returncode == 2 and "--repeats must be >= 1" in done.stderr


@pytest.mark.timeout(1200)
def test_persistent_ranks_rows_measure_every_column(quick_results):
    """Item 7: persistent run() against a fresh launch and ipyparallel, and the DDP step
    in a new run() against one inside a call; every column measured, the goals judged."""
    rows = [cells for cells in table_rows(quick_results) if cells[0] == "7"]
    assert len(rows) == 2 and all(len(cells) == 11 for cells in rows), rows
    trivial, step = rows
    assert "persistent run():" in trivial[3] and "n=10" in trivial[3]
    assert "notebook_launcher launch:" in trivial[7] and "n=1" in trivial[7]
    assert "ipyparallel apply_sync:" in trivial[7] and "n=10" in trivial[7].split("ipyparallel")[1]
    assert "launch/persistent" in trivial[8] and "ipyparallel/persistent" in trivial[8]
    assert "step in a new run():" in step[3] and "step inside one call:" in step[7]
    assert "new run()/inside" in step[8]
    for cells in rows:
        assert cells[10] in ("yes", "**NO (missed)**")
        assert not any("error:" in cell or "not available" in cell for cell in cells), cells


@pytest.mark.skipif(not os.environ.get("NOTEBOOK_LAUNCH_BENCHMARK_RAY"),
                    reason="item 9 starts a two-node Ray cluster and TorchTrainer (minutes): "
                           "NOTEBOOK_LAUNCH_BENCHMARK_RAY=1 runs it")
@pytest.mark.timeout(1800)
def test_ray_cluster_rows_are_measured(tmp_path):
    out = tmp_path / "RESULTS.md"
    done = run_command("--quick", "--repeats", "1", "--only", "9", "--out", str(out), "--plots", "",
                       timeout=1700)
    assert done.returncode == 0, f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"
    rows = [cells for cells in table_rows(out.read_text()) if cells[0] == "9"]
    assert len(rows) == 3, rows
    assert not any("error:" in cell or "not measured" in cell for cells in rows for cell in cells), rows


@pytest.mark.skipif(not os.environ.get("NOTEBOOK_LAUNCH_BENCHMARK_SLURM"),
                    reason="the SLURM rows start a two-node SLURM and run submitit beside it (about 3 minutes): "
                           "NOTEBOOK_LAUNCH_BENCHMARK_SLURM=1 runs them")
@pytest.mark.timeout(1200)
def test_slurm_rows_are_measured_beside_submitit(tmp_path):
    rows = quick_module_rows("slurm_cluster", str(tmp_path / "RESULTS-slurm.md"), "33.6", timeout=1100)
    assert len(rows) == 6, rows
    measured, persistent = rows[:5], rows[5]
    assert all("n=1" in cells[3] and "submitit" in cells[7] and "n=1" in cells[7] for cells in measured), measured
    assert "n=20" in persistent[3] and "error" not in persistent[3], persistent   # the warm calls, timed
