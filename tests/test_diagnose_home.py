"""Hang diagnosis has one home (issue 31 item 2): ``notebook_launch/diagnose/``. These read the
package's source: what the diagnosis does is tested with real ranks in test_hang_diagnosis.py,
test_asking_never_hurts.py, test_stall_signs.py and test_native_stacks.py."""
from __future__ import annotations

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "notebook_launch"


def _strings(path: pathlib.Path) -> list[str]:
    """Every string constant in ``path``, the literal parts of f-strings included."""
    return [node.value for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)]


def test_one_walk_reads_the_threads_of_a_process():
    """``diagnose.proc_tasks`` is the one module that lists a process's threads in /proc (stall
    detection's descendants, the children asked for their stacks, the schedstat that says whether
    a silent rank's interpreter lock is held, XLA's replicas under their launcher)."""
    walkers = sorted(path.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("*.py")
                     if any("/task" in text for text in _strings(path)))
    assert walkers == ["diagnose/proc_tasks.py"]


def test_the_rank_process_interface_declares_how_a_process_is_asked():
    """``RankProcess.where`` is the one way the diagnosis asks a process that answers for its ranks
    itself; XLA's launcher and a Ray actor implement it, fork and spawn keep the default (asked by
    pid), and nothing looks the method up by name (no getattr/hasattr duck typing)."""
    from notebook_launch.engines.local.fork import ForkedRank
    from notebook_launch.engines.ray.gang import RayRank
    from notebook_launch.engines.local.spawn import SpawnedRank
    from notebook_launch.engines.xla.launcher import XlaLauncherProcess
    from notebook_launch.channels import RankProcess

    assert XlaLauncherProcess.where is not RankProcess.where
    assert RayRank.where is not RankProcess.where
    assert ForkedRank.where is RankProcess.where and SpawnedRank.where is RankProcess.where
    assert isinstance(RankProcess.__dict__["reaped"], property)
    looked_up = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("getattr", "hasattr") and len(node.args) >= 2
                    and isinstance(node.args[1], ast.Constant)
                    and node.args[1].value in ("where", "ask_where", "reaped", "_status", "popen")):
                looked_up.append(f"{path.relative_to(PACKAGE)}: {node.func.id}(..., {node.args[1].value!r})")
    assert looked_up == []
