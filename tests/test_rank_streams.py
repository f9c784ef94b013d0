"""Rank output edge cases outside a kernel: tqdm writing to the user's own file, and
forking after the notebook ran an OpenMP parallel region (libgomp is not fork-safe)."""
import io
import os
import subprocess
import sys
import textwrap

import pytest
from helpers.panel_helpers import KeepStateDisplay

from notebook_launch import notebook_launcher

# Deterministic bar text (no rates, no timings), every update drawn.
PLAIN_BAR = {"desc": "own", "bar_format": "{desc}: {n_fmt}/{total_fmt}", "mininterval": 0, "miniters": 1}


def _bars_into(file):
    from tqdm import tqdm
    for _ in tqdm(range(5), file=file, **PLAIN_BAR):
        pass
    with tqdm(total=3, file=file, **PLAIN_BAR) as bar:
        bar.update(2)
        bar.update(1)


def _bars_into_own_file():
    own = io.StringIO()
    _bars_into(own)
    print("rank output after the bars")
    return own.getvalue()


def test_tqdm_with_the_users_file_writes_it_and_still_reaches_the_panel():
    pytest.importorskip("tqdm")
    expected = io.StringIO()
    _bars_into(expected)   # plain tqdm, in this (unpatched) process
    display = KeepStateDisplay()
    results = notebook_launcher(_bars_into_own_file, num_processes=2, ui=display)
    assert results == [expected.getvalue()] * 2
    for rs in display.state.ranks:
        bars = [(bar.desc, bar.n, bar.total, bar.closed) for bar in rs.bars.values()]
        assert bars == [("own", 5, 5, True), ("own", 3, 3, True)], bars
    texts = [text for _, _, text in display.lines]
    assert texts.count("rank output after the bars") == 2
    assert not [t for t in texts if "own:" in t], texts   # the bar text went to the file only


OPENMP_AFTER_NOTEBOOK_RAN_ONE = textwrap.dedent("""
    import json, sys
    import torch
    from notebook_launch import notebook_launcher

    x = torch.ones(64 * 1024 * 1024)
    y = x * 2   # the notebook's main thread runs an OpenMP parallel region: libgomp's pool is its

    def first_parallel_op():
        torch.set_num_threads(2)
        total = torch.ones(64 * 1024 * 1024).sum().item()
        return torch.get_num_threads(), total

    for ranks in (1, 2):
        results = notebook_launcher(first_parallel_op, num_processes=ranks, timeout=60, ui="none")
        print(json.dumps(results), flush=True)
    from notebook_launch import start_ranks   # persistent ranks fork the same way
    for ranks in (1, 2):
        with start_ranks(ranks, timeout=60, ui="none") as pool:
            print(json.dumps(pool.run(first_parallel_op)), flush=True)
""")


def test_ranks_forked_after_an_openmp_region_in_the_notebook_do_not_hang(tmp_path):
    """notebook_launcher and persistent ranks, 1 and 2 ranks of 2 threads each."""
    pytest.importorskip("torch")
    script = tmp_path / "openmp_then_fork.py"
    script.write_text(OPENMP_AFTER_NOTEBOOK_RAN_ONE)
    env = dict(os.environ, OMP_NUM_THREADS="2")   # every rank keeps 2 threads, also with 2 ranks on 2 cores
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=400,
                          check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("[[")]
    expected = ["[[2, 67108864.0]]", "[[2, 67108864.0], [2, 67108864.0]]"]
    assert lines == expected * 2, proc.stdout[-3000:]
