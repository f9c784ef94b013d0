"""Nothing XLA replicas started outlives the notebook: the keeper's XLA registration
(backends/xla.py hands the launcher child's process group and the run's mark to
``leftovers``), on real torch_xla.

tests/test_notebook_death_children.py covers forked and persistent ranks; here the ranks are two
PJRT CPU replicas, threads of one replica process under the launcher child, each starting what
users' code starts (a Popen child, a DataLoader worker, a setsid grandchild). The kernel is
SIGKILLed (a hard restart: no cleanup code of ours runs) and every process below it must end.
"""
from __future__ import annotations

import psutil
import pytest

pytest.importorskip("torch_xla", reason="torch_xla is not installed: run bash scripts/test-xla.sh")

from helpers.nbutil import running_kernel  # noqa: E402
from test_notebook_death_children import kill_kernel_and_check, launch_ranks_that_start_children  # noqa: E402


def test_a_killed_kernel_leaves_nothing_xla_replicas_started(tmp_path, monkeypatch):
    monkeypatch.setenv("PJRT_DEVICE", "CPU")   # the kernel inherits them
    monkeypatch.setenv("CPU_NUM_DEVICES", "2")
    with running_kernel(str(tmp_path)) as (km, client):
        check_replicas_and_what_they_started_end_with_the_kernel(km, client, tmp_path)


def check_replicas_and_what_they_started_end_with_the_kernel(km, client, tmp_path) -> None:
    reported = launch_ranks_that_start_children(client, tmp_path, 'ui="none"', ranks=2)   # a line per replica
    assert len(set(reported)) == 7, reported   # the replicas share one process
    # and the launcher child above the replica process, which ends with them
    below = {p.pid for p in psutil.Process(km.provisioner.process.pid).children(recursive=True)}
    assert set(reported) <= below, (reported, below)
    kill_kernel_and_check(km, sorted(below))
