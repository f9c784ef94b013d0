"""What the warm start process imports before it forks ranks (``engines.local.start_server``): everything a
rank forked from it imports on its way to the user's function is imported there once, not in every rank.
numpy 2 imports ``numpy.random`` lazily, and each rank restored the notebook's numpy random state with it
(12-17 ms of each rank's CPU, most of a warm spawn-class launch's gap to fork, issue 41)."""
from __future__ import annotations

import json
import pickle
import subprocess
import sys
import time

import pytest

from notebook_launch import notebook_launcher
from notebook_launch.engines.local import start_process
from notebook_launch.planning.net import free_port
from notebook_launch.rank import spawn_context

pytestmark = pytest.mark.timeout(300)

# A fresh Python that imports what the start process imports, then restores the notebook's state as
# a rank does (rank.spawn_entry) and prints the modules that restoring imported.
RESTORE = """
import json, pickle, sys
from notebook_launch.rank.preload import warm
warm(["torch", "torch.distributed"], quiet_if_missing=True)
from notebook_launch.rank import spawn_entry, spawn_context
before = set(sys.modules)
spawn_context.restore_state(pickle.loads(sys.stdin.buffer.read()))
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def rank_modules():
    import sys
    return sorted(sys.modules)


def test_restoring_the_notebooks_state_in_a_rank_imports_nothing_the_start_process_lacks(tmp_path):
    pytest.importorskip("numpy")
    import numpy.random  # noqa: F401  (a notebook that uses numpy: its random state travels to the ranks)
    import torch  # noqa: F401
    context = pickle.dumps(spawn_context.capture_context())
    done = subprocess.run([sys.executable, "-c", RESTORE], input=context, capture_output=True, timeout=240,
                          check=True)
    imported_by_restore = set(json.loads(done.stdout))
    assert "numpy.random" in imported_by_restore   # what a fresh Python lacks: the case this test is about
    notebook_launcher(rank_modules, num_processes=1, start_method="spawn", ui="none", timeout=240,
                      log_dir=str(tmp_path / f"logs-{time.monotonic_ns()}"), use_port=free_port())
    process = start_process.running()
    assert process is not None
    held = set(process.state()["modules"])
    assert imported_by_restore <= held, f"each rank imports these itself: {sorted(imported_by_restore - held)}"
