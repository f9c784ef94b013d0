"""The notebooks in notebooks/ run top to bottom in a real kernel and show what they promise."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from helpers.nbutil import cell_text, run_notebook

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def _outputs(nb) -> str:
    return "\n".join(cell_text(c) for c in nb.cells if c.cell_type == "code")


def _errors(nb):
    return [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
            if o.output_type == "error"]


def test_quickstart_cpu():
    nb = run_notebook(NOTEBOOKS / "quickstart_cpu.ipynb", timeout=300)
    assert not _errors(nb)
    text = _outputs(nb)
    for rank in (0, 1):
        match = re.search(rf"rank {rank} of 2: final loss ([0-9.]+)", text)
        assert match and float(match.group(1)) < 0.5, text
    assert "same weights on every rank: True" in text
    assert "failed rank: 1" in text
    assert "first line: rank 1 failed: ValueError: rank 1 found a bad batch" in text
    assert "world 2 all_reduce total 3.0" in text


def test_accelerate_training():
    pytest.importorskip("accelerate")
    nb = run_notebook(NOTEBOOKS / "accelerate_training.ipynb", timeout=300)
    assert not _errors(nb)
    text = _outputs(nb)
    for rank in (0, 1):
        match = re.search(rf"rank {rank}: accuracy ([0-9.]+) on 256 samples, mixed precision bf16", text)
        assert match and float(match.group(1)) > 0.85, text
    assert "same weights on every rank: True" in text
    match = re.search(r"accuracy in the notebook: ([0-9.]+)", text)
    assert match and float(match.group(1)) > 0.85


def test_notebooks_are_stored_without_outputs():
    """Committed notebooks carry no stale outputs: what a reader sees comes from a real run."""
    import nbformat
    for path in NOTEBOOKS.glob("*.ipynb"):
        nb = nbformat.read(str(path), as_version=4)
        nbformat.validate(nb)
        assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), path.name


def test_interactive_ranks():
    nb = run_notebook(NOTEBOOKS / "interactive_ranks.ipynb", timeout=300)
    assert not _errors(nb)
    text = _outputs(nb)
    assert "2 ranks on notebook (CPU, gloo, fork, persistent)" in text
    first = re.search(r"losses after epoch 1: \[([0-9.]+), ([0-9.]+)\]", text)
    second = re.search(r"losses after epoch 2: \[([0-9.]+), ([0-9.]+)\]", text)
    assert first and second and float(second.group(1)) < float(first.group(1)), text  # the same model trained on
    assert "same weights on every rank: True" in text
    learned = re.search(r"learned weights: \[([-0-9., ]+)\]", text)
    assert learned and abs(float(learned.group(1).split(",")[0]) - 2.0) < 0.2, text
    failing = next(c for c in nb.cells if c.cell_type == "code" and "bad_step" in c.source)
    failing_call = cell_text(failing)
    shown = f"{failing_call}\n--- its outputs, as the kernel sent them ---\n{failing.get('outputs')}"
    assert "failed rank: 1" in failing_call, shown
    still_running = "last line: The ranks are still running, with their state; the next call runs on them."
    assert still_running in failing_call, shown
    assert "training goes on: [" in failing_call, shown
    assert "rank 1 sees total 3.0" in text
    assert "[3.0, 3.0]" in text
