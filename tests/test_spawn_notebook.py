"""start_method="spawn" from a real Jupyter kernel (nbclient): a function
defined in a notebook cell, closing over an instance of a class defined in the
notebook, runs on 2 spawned ranks and its results come back to the cell."""
from __future__ import annotations

import pytest

from helpers.nbutil import cell_text, notebook_from_cells, run_notebook

pytest.importorskip("nbclient")

SETUP = """
import pickle, subprocess, sys
from notebook_launch import LaunchError, notebook_launcher
from notebook_launch.detect.platform import detect
from notebook_launch.planning.net import free_port  # other test runs on this machine use 29500 too
where = detect()
print("detected:", where.platform, where.frontend)
"""

DEFINE = """
class Counter:
    def __init__(self, start):
        self.start = start
    def count(self, rank):
        return self.start + rank

def make_train(counter):
    def train(scale):
        import torch
        import torch.distributed as dist
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        total = torch.tensor([float(counter.count(rank) * scale)])
        dist.all_reduce(total)
        dist.destroy_process_group()
        print(f"rank {rank} trained")
        return {"rank": rank, "value": counter.count(rank) * scale, "sum": total.item(),
                "cls": type(counter).__name__}
    return train

train = make_train(Counter(10))
"""

# Why spawn needs cloudpickle: plain pickle finds no Counter in a fresh process's __main__.
PLAIN_PICKLE = """
child = subprocess.run([sys.executable, "-c", "import pickle, sys; pickle.loads(sys.stdin.buffer.read())"],
                       input=pickle.dumps(Counter(1)), capture_output=True)
print("plain pickle in a fresh process:", child.stderr.decode().strip().splitlines()[-1])
"""

LAUNCH = """
results = notebook_launcher(train, args=(2,), num_processes=2, start_method="spawn", ui="text", timeout=300,
                            use_port=str(free_port()))
print("RESULTS", results)
assert results == [{"rank": 0, "value": 20, "sum": 42.0, "cls": "Counter"},
                   {"rank": 1, "value": 22, "sum": 42.0, "cls": "Counter"}], results
"""

FAIL = """
def failing():
    import os
    if os.environ["RANK"] == "1":
        raise ValueError("boom from the notebook")
    return "fine"

try:
    notebook_launcher(failing, num_processes=2, start_method="spawn", ui="text", timeout=300,
                      use_port=str(free_port()))
except LaunchError as exc:
    print("CAUGHT", exc)
"""


def test_notebook_defined_closure_over_notebook_class_runs_on_two_spawned_ranks(tmp_path):
    nb = run_notebook(notebook_from_cells(SETUP, DEFINE, PLAIN_PICKLE, LAUNCH, FAIL),
                      cwd=str(tmp_path), timeout=400)
    setup, _, plain, launch, fail = (cell_text(c) for c in nb.cells)

    assert "detected: notebook notebook" in setup
    assert "Can't get attribute 'Counter' on <module '__main__'" in plain
    assert "notebook_launch: 2 ranks on notebook (CPU, gloo, spawn)" in launch
    assert "[rank 0] rank 0 trained" in launch and "[rank 1] rank 1 trained" in launch
    assert "RESULTS [{'rank': 0, 'value': 20, 'sum': 42.0, 'cls': 'Counter'}" in launch
    assert "CAUGHT rank 1 failed: ValueError: boom from the notebook" in fail
    # The cell's source travels with the job, so the rank's traceback shows the failing line.
    assert 'raise ValueError("boom from the notebook")' in fail
    assert "rank 0: finished" in fail or "rank 0: stopped" in fail
