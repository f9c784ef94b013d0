"""What counts as progress for stall detection (issue 32, item 3), with real gloo ranks, both ways:

- a real hang is called stalled however much its threads chatter: bytes read and written are no
  sign (rank 0's TCPStore polls while it waits for a rank that never calls
  ``init_process_group``; a logger thread writes a log file, another reads one, while the ranks
  wait in an all_reduce one of them skipped);
- real work that shows nothing is never called stalled, wherever the CPU time is spent: in a
  subprocess a worker thread started (and in that subprocess's own child), or in short
  subprocesses that ended between two looks.

Each launch uses ``stall_after=2``; a stalled run is stopped as soon as it is reported (the
Stop button's path), so a test that fails does so by its timeout, never by a wait of ours.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from helpers.watching import WatchingDisplay, WhereReports

from notebook_launch import LaunchError, notebook_launcher
from notebook_launch.planning.net import free_port

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

HANG = 600         # seconds a hanging rank sleeps (the stop ends it long before)
WORK = 8.0         # CPU seconds a silently working process spends: 4 x (stall_after + STACK_GAP)
SHORT = 0.05       # CPU seconds of each of many short subprocesses: rarely alive when the notebook looks
BUSY = ("import time\n"
        "end = time.process_time() + {seconds}\n"   # CPU seconds, however loaded the machine
        "while time.process_time() < end:\n"
        "    sum(range(1000))\n")


def rank() -> int:
    return int(os.environ["RANK"])


# --- hangs that chatter: stalled ----------------------------------------------------------------

def never_joins_the_group():
    """Rank 1 never calls init_process_group: rank 0 waits in it, polling its TCPStore."""
    if rank() == 1:
        time.sleep(HANG)
    dist.init_process_group("gloo")


def chatter(folder: str) -> None:
    """A logger writing 17 bytes every half second, and a thread reading a file as often."""
    def write() -> None:
        with open(os.path.join(folder, f"log{rank()}.txt"), "a") as log:
            while True:
                log.write("heartbeat: alive\n")
                log.flush()
                time.sleep(0.5)

    def read() -> None:
        while True:
            with open("/proc/self/status", "rb") as status:
                status.read()
            time.sleep(0.5)

    for target in (write, read):
        threading.Thread(target=target, daemon=True).start()


def skips_an_all_reduce_while_chattering(folder: str):
    chatter(folder)
    dist.init_process_group("gloo")
    t = torch.ones(4)
    dist.all_reduce(t)
    if rank() == 1:
        time.sleep(HANG)
    dist.all_reduce(t)


def stopped_when_stalled() -> tuple[list[str], WatchingDisplay]:
    """A text display that presses Stop the moment the panel shows the run stalled (as a person
    would); the reports come back in the list."""
    shown = WhereReports()

    def stop(state):
        if shown.new(state) is not None:
            state.stop_requested = True

    return shown.texts, WatchingDisplay(on_refresh=stop)


@pytest.mark.parametrize("function", [never_joins_the_group, skips_an_all_reduce_while_chattering],
                         ids=["tcpstore-polling", "logger-and-reader-threads"])
def test_a_hang_that_reads_and_writes_is_stalled(function, log_dir, tmp_path):
    reports, display = stopped_when_stalled()
    args = (str(tmp_path),) if function is skips_an_all_reduce_while_chattering else ()
    with pytest.raises(LaunchError) as info:
        notebook_launcher(function, args, num_processes=2, stall_after=2, log_dir=log_dir, ui=display,
                          use_port=str(free_port()), timeout=90)
    assert info.value.kind == "stopped", str(info.value)   # not "timeout": the stall was seen
    assert reports and reports[0].startswith("stalled: no rank showed progress for 2 s; "), reports
    if args:   # the chatter really went on while the ranks hung
        assert os.path.getsize(tmp_path / "log0.txt") >= 2 * len("heartbeat: alive\n")


# --- work that shows nothing: not stalled -------------------------------------------------------

def works_in_a_grandchild_from_a_thread():
    """Rank 0's worker thread starts a subprocess, whose own child computes; rank 0's main thread
    waits for the thread, rank 1 in a barrier. Nothing is printed."""
    dist.init_process_group("gloo")
    if rank() == 0:
        parent = ("import subprocess, sys\n"
                  f"subprocess.run([sys.executable, '-c', {BUSY.format(seconds=WORK)!r}], check=True)\n")
        worker = threading.Thread(target=subprocess.run, args=([sys.executable, "-c", parent],),
                                  kwargs={"check": True})
        worker.start()
        worker.join()
    dist.barrier()
    return rank()


def works_in_short_subprocesses():
    """Rank 0's worker thread runs many short computing subprocesses one after the other, each gone
    before the next look (their CPU time is what the rank reaped)."""
    dist.init_process_group("gloo")
    if rank() == 0:
        def run_them() -> None:
            command = [sys.executable, "-S", "-c", BUSY.format(seconds=SHORT)]
            for _ in range(int(WORK / SHORT)):
                subprocess.run(command, check=True)

        worker = threading.Thread(target=run_them)
        worker.start()
        worker.join()
    dist.barrier()
    return rank()


def not_marked() -> tuple[list[object], WatchingDisplay]:
    """Every stall mark and where-report the panel of the run is shown, in the list (a mark is
    always shown: the supervisor refreshes the display right after each stall check)."""
    marked: list[object] = []
    reports = WhereReports()

    def watch(state):
        marked.extend((rs.local_rank, rs.stalled_since) for rs in state.ranks if rs.stalled_since is not None)
        if reports.new(state) is not None:
            marked.append(state.where_report)

    return marked, WatchingDisplay(on_refresh=watch)


@pytest.mark.parametrize("function", [works_in_a_grandchild_from_a_thread, works_in_short_subprocesses],
                         ids=["grandchild-of-a-thread", "short-subprocesses"])
def test_work_in_processes_below_the_rank_is_not_stalled(function, log_dir):
    marked, display = not_marked()
    assert notebook_launcher(function, num_processes=2, stall_after=2, log_dir=log_dir, ui=display,
                             use_port=str(free_port()), timeout=180) == [0, 1]
    assert marked == []


def test_descendants_are_every_threads_children_and_theirs():
    """``descendants`` (diagnose.proc_tasks) finds a child a non-main thread started and that child's own child."""
    from notebook_launch.diagnose.stall import cpu_seconds, descendants
    ready = threading.Event()
    started: list[subprocess.Popen] = []

    def start() -> None:
        started.append(subprocess.Popen(
            [sys.executable, "-c", "import subprocess, sys, time\n"
             "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
             "print(child.pid, flush=True)\n"
             "time.sleep(60)\n"], stdout=subprocess.PIPE))
        ready.set()

    thread = threading.Thread(target=start)
    thread.start()
    ready.wait()
    thread.join()
    child = started[0]
    assert child.stdout is not None
    grandchild = int(child.stdout.readline())
    try:
        assert {child.pid, grandchild} <= set(descendants(os.getpid()))
        assert cpu_seconds(os.getpid()) is not None
    finally:
        os.kill(grandchild, 9)
        child.kill()
        child.wait()


ON_ONE_CORE = "import os, sys, time\nos.sched_setaffinity(0, {int(sys.argv[1])})\nprint(flush=True)\n"
KINDS = {
    "computes": "while True:\n    pass\n",
    "polls every 5 ms": "while True:\n    time.sleep(0.005)\n",
    "sleeps": "time.sleep(600)\n",
}


def test_a_computing_rank_starved_of_cpu_by_a_loaded_machine_works_and_a_waiting_one_does_not():
    """On one core beside 25 busy processes a computing process gets under 4% of it, below
    BUSY_SHARE: the time it waits for the core is what says it works. A poller and a sleeper on
    the same core wait for it only briefly after each wake-up and stay quiet. The watch reads
    the real CPU time and run delay of real processes (without the run delay the computing one
    was called quiet; a test under CI's load saw a computing rank called stalled)."""
    from notebook_launch.diagnose.stall import SAMPLE_EVERY, StallWatch
    core = min(os.sched_getaffinity(0))
    started = []

    def start(code: str) -> subprocess.Popen:
        process = subprocess.Popen([sys.executable, "-c", ON_ONE_CORE + code, str(core)], stdout=subprocess.PIPE)
        started.append(process)
        return process

    try:
        load = [start(KINDS["computes"]) for _ in range(25)]
        watched = {kind: start(code) for kind, code in KINDS.items()}
        for process in load + list(watched.values()):
            assert process.stdout is not None and process.stdout.readline() == b"\n"   # on its core
        watch = StallWatch(60, now=time.monotonic())
        pids = {index: process.pid for index, process in enumerate(watched.values())}
        seen = {index: watch.quiet_since(index, pid, time.monotonic()) for index, pid in pids.items()}
        for _ in range(3):   # three samples, each over SAMPLE_EVERY
            time.sleep(SAMPLE_EVERY)
            now = time.monotonic()
            quiet = {kind: watch.quiet_since(index, pids[index], now) for index, kind in enumerate(watched)}
        assert quiet["computes"] > seen[0], "the starved computing process was called quiet"
        assert quiet["polls every 5 ms"] == seen[1] and quiet["sleeps"] == seen[2], quiet
    finally:
        for process in started:
            process.kill()
            process.wait()
