"""An interrupt that comes once the ranks run but before the supervisor holds them (while it is
set up: its watcher, the first round of each rank's resources, its hang watch) ends the ranks as
any interrupt does. It used to leave them running: the py314 lane's
test_interrupting_the_notebook_stops_spawned_ranks found two ranks alive after the notebook's
KeyboardInterrupt (in a kernel they would have run on). The interrupt is raised from the real
supervisor's set-up once every rank has begun the user's function, so the window is hit every
time, not by a timer."""
from __future__ import annotations

import os
import time

import pytest

from notebook_launch import notebook_launcher
from notebook_launch.supervise.supervisor import Supervisor

from helpers.processes import children, running

SLEEPER = '''
def sleeper(folder):
    import os, time
    open(os.path.join(folder, str(os.getpid())), "w").close()
    time.sleep(600)
'''


def sleeper_function():
    namespace: dict = {}
    exec(compile(SLEEPER, "<cell>", "exec"), namespace)
    return namespace["sleeper"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_an_interrupt_while_the_supervisor_is_set_up_ends_the_ranks(tmp_path, monkeypatch, start_method):
    pids = tmp_path / "pids"
    pids.mkdir()
    set_up = Supervisor.__init__

    def interrupted_set_up(self, *args, **kwargs):
        deadline = time.monotonic() + 120
        while len(os.listdir(pids)) < 2 and time.monotonic() < deadline:   # both ranks run the function
            time.sleep(0.05)
        set_up(self, *args, **kwargs)
        raise KeyboardInterrupt   # as Ctrl-C would, before run() holds the ranks

    monkeypatch.setattr(Supervisor, "__init__", interrupted_set_up)
    with pytest.raises(KeyboardInterrupt):
        notebook_launcher(sleeper_function(), args=(str(pids),), num_processes=2, start_method=start_method,
                          ui="none", log_dir=str(tmp_path / "logs"))
    rank_pids = [int(name) for name in os.listdir(pids)]
    assert len(rank_pids) == 2
    left = [p for p in running(children()) if p.pid in rank_pids]
    assert not left, f"ranks still running after the interrupt: {left}"
    assert not any(os.path.exists(f"/proc/{pid}") for pid in rank_pids), "a rank was not reaped"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("start_method", ["fork", "spawn"])
@pytest.mark.parametrize("raised", [KeyboardInterrupt, OSError])
def test_a_start_of_persistent_ranks_stopped_part_way_ends_its_ranks(tmp_path, monkeypatch, start_method, raised):
    """The same window for ``start_ranks``: once its ranks run, an interrupt (or an error) before the
    pool is handed out ends them. The pool's finalizer alone would wait for the traceback to go,
    which a notebook keeps (``sys.last_traceback``); this test keeps it too."""
    from notebook_launch import start_ranks
    from notebook_launch.persistent.life import RankLife
    started = RankLife.start_idle
    seen: list[int] = []

    def interrupted(self, events):
        started(self, events)
        seen.extend(process.pid for process in self.transport.processes)   # every rank runs now
        raise raised("stopped while starting")

    monkeypatch.setattr(RankLife, "start_idle", interrupted)
    with pytest.raises(raised) as kept:   # the traceback stays alive, as a notebook's last one
        start_ranks(2, ui="none", start_method=start_method, log_dir=str(tmp_path / "logs"))
    assert len(seen) == 2 and kept.value is not None
    left = [p for p in running(children()) if p.pid in seen]
    assert not left, f"ranks still running after the start was stopped: {left}"
    assert not any(os.path.exists(f"/proc/{pid}") for pid in seen), "a rank was not reaped"


@pytest.mark.timeout(300)
def test_an_interrupt_while_the_start_process_answers_ends_the_ranks_it_forked(tmp_path, monkeypatch):
    """Spawn-class ranks are forked by the warm start process, and the notebook learns their pids
    from its answer. An interrupt that came while the answer was on its way (the py314 lane, on
    a busy machine) left the ranks it had forked running: the notebook never read their pids.
    Here the SIGINT comes once the ranks run the function, before the fork request's answer is read.
    (Ranks that had not yet sent their first event died of the pipes the failed start closed.)"""
    import signal
    from notebook_launch.engines.local import start_client, start_process
    start_process.current()   # warm and ready: its ready message read before the test
    send = start_client.start_wire.send
    pids = tmp_path / "pids"
    pids.mkdir()
    sent: list[int] = []

    def interrupted_send(sock, message, fds=()):
        send(sock, message, fds)
        if "ranks" in message and not sent:   # the fork request is out: the ranks are being forked
            sent.append(1)
            deadline = time.monotonic() + 120
            while len(os.listdir(pids)) < 2 and time.monotonic() < deadline:   # both run the function
                time.sleep(0.05)
            os.kill(os.getpid(), signal.SIGINT)   # Python runs the handler here, before the answer is read

    monkeypatch.setattr(start_client.start_wire, "send", interrupted_send)
    before = {p.pid for p in start_process_children()}
    with pytest.raises(KeyboardInterrupt):
        notebook_launcher(sleeper_function(), args=(str(pids),), num_processes=2, start_method="spawn",
                          ui="none", log_dir=str(tmp_path / "logs"))
    assert sent and len(os.listdir(pids)) == 2, "the ranks did not run before the interrupt"
    deadline = time.monotonic() + 30   # the start process reaps what was killed within milliseconds
    left = [p for p in running(start_process_children()) if p.pid not in before]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [p for p in running(start_process_children()) if p.pid not in before]
    assert not left, f"ranks the start process forked still run after the interrupt: {left}"


def start_process_children():
    import psutil
    from notebook_launch.engines.local import start_process
    process = start_process.running()
    if process is None:
        return []
    try:
        return psutil.Process(process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
