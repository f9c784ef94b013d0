"""The OOM watch walks a rank's tree (``/proc/<pid>/task/*/children``) only when a process may have
been born below the ranks since its last round (``supervise.births``, issue 45: the walk left the
where-thread's /proc entry cached, and reaping the rank then cost the notebook 2-8 ms). What must
hold: a process a rank starts is still seen, from its main thread or from another thread, right
at the start or later; a launch whose ranks start nothing walks nothing."""
from __future__ import annotations

import os
import subprocess
import threading
import time

from notebook_launch import notebook_launcher
from notebook_launch.planning.net import free_port
from notebook_launch.supervise import oom

ROUNDS = 3.5   # seconds a rank keeps its child: three resource rounds (SAMPLE_EVERY) at least


def starts_a_child(pid_file: str, from_thread: bool, after: float) -> int:
    """Start ``sleep`` (from another thread, or the main one) ``after`` seconds in, keep it
    ROUNDS seconds, and return its pid."""
    found: list[int] = []

    def start() -> None:
        time.sleep(after)
        child = subprocess.Popen(["sleep", "60"])
        found.append(child.pid)
        with open(pid_file, "w") as file:
            file.write(str(child.pid))
        time.sleep(ROUNDS)
        child.kill()
        child.wait()

    if from_thread:
        worker = threading.Thread(target=start)
        worker.start()
        worker.join()
    else:
        start()
    return found[0]


def walks_noted(monkeypatch, tmp_path) -> "list[list[int]]":
    """Every walk of a rank's tree in this process, what it found (filled as the launch runs)."""
    walks: list[list[int]] = []
    walk = oom.descendants

    def noting(pid: int) -> list[int]:
        found = walk(pid)
        walks.append(found)
        return found

    monkeypatch.setattr(oom, "descendants", noting)
    return walks


def test_a_child_started_at_once_from_a_worker_thread_is_seen(monkeypatch, tmp_path):
    walks = walks_noted(monkeypatch, tmp_path)
    (child,) = notebook_launcher(starts_a_child, args=(str(tmp_path / "pid"), True, 0.0), num_processes=1,
                                 use_port=free_port(), ui="text")
    assert any(child in found for found in walks), (child, walks)


def test_a_child_started_later_from_the_main_thread_is_seen(monkeypatch, tmp_path):
    walks = walks_noted(monkeypatch, tmp_path)
    children = notebook_launcher(starts_a_child, args=(str(tmp_path / "pid"), False, 1.5), num_processes=2,
                                 use_port=free_port(), ui="text")
    for child in children:
        assert any(child in found for found in walks), (child, walks)


def trivial() -> int:
    return os.getpid()


def test_ranks_that_start_nothing_are_not_walked(monkeypatch, tmp_path):
    """However many processes the machine starts meanwhile (the look's bound raised: past it, the
    watch walks, as it cannot tell)."""
    from notebook_launch.supervise import births
    monkeypatch.setattr(births, "MAX_LOOKS", 1 << 20)
    walks = walks_noted(monkeypatch, tmp_path)
    assert len(notebook_launcher(trivial, num_processes=4, use_port=free_port(), ui="text")) == 4
    assert walks == []
