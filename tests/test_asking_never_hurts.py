"""Asking a rank where it is never hurts it (issue 31): every way the notebook collects stacks
asks the rank's where-thread (``rank.reports.where_thread``, ``diagnose.where_thread``), never signals a
rank whose interpreter lock is free, and falls back to the signal only for a rank whose lock is
held by C code, which the verdict then says.

Real ranks throughout. The ranks count the signals they get with handlers of their own
(``COUNTED``: the dump signal, which these handlers replace, and every other one a user could
catch but the stop's SIGTERM), and sleep in C with ``sleep(3)``, which a handled signal ends early
(it does not restart): a rank that sleeps its full time and counted nothing was not touched.
"""
from __future__ import annotations

import ast
import ctypes
import inspect
import os
import pathlib
import signal
import threading
import time

import pytest

import notebook_launch
from notebook_launch import LaunchError, notebook_launcher, start_ranks
from notebook_launch.planning.net import free_port

pytestmark = pytest.mark.timeout(300)
HERE = os.path.basename(__file__)
PACKAGE = pathlib.Path(notebook_launch.__file__).resolve().parent
COUNTED = sorted({signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM,
                  signal.SIGPIPE, *range(signal.SIGRTMIN, signal.SIGRTMAX + 1)})
REQUESTS = 1000


def line_of(function, text: str) -> int:
    lines, first = inspect.getsourcelines(function)
    for offset, line in enumerate(lines):
        if text in line:
            return first + offset
    raise AssertionError(f"{text!r} not in {function.__name__}")


# --- in the ranks ---------------------------------------------------------------------------
signals: list[int] = []   # the signals this rank got (count_signals)
storm: dict = {}          # the thread storm's stop event and count of threads started
kept: int                 # set by keep()


def count_signals(marks: str | None = None) -> None:
    """Count every signal in COUNTED (and write it to ``marks`` at once, for a rank that is killed)."""
    def counted(signum, frame):
        signals.append(signum)
        if marks is not None:
            with open(marks, "a") as f:
                f.write(f"{os.getpid()} signal {signum}\n")

    for signum in COUNTED:
        signal.signal(signum, counted)


def keep(value: int) -> None:
    global kept
    kept = value


def kept_plus_one() -> int:
    return kept + 1


def start_storm() -> None:
    """Threads that start threads that start threads, without pause, until stop_storm."""
    stop, started = threading.Event(), [0]

    def spawn(depth: int) -> None:
        started[0] += 1
        if depth < 3 and not stop.is_set():
            children = [threading.Thread(target=spawn, args=(depth + 1,)) for _ in range(2)]
            for child in children:
                child.start()
            for child in children:
                child.join()

    def rounds() -> None:
        while not stop.is_set():
            spawn(0)

    storm.update(stop=stop, started=started)
    for _ in range(2):
        threading.Thread(target=rounds, name="storm", daemon=True).start()


def storm_started() -> int:
    return storm["started"][0]


def stop_storm() -> tuple[int, list[int]]:
    storm["stop"].set()
    return storm["started"][0], list(signals)


def sleep_in_c(seconds: int) -> tuple[float, int, list[int]]:
    """``sleep(3)`` from C (ctypes releases the lock): how long it slept, what it says was left
    (not 0: a signal's handler ended it early), and the signals counted."""
    libc = ctypes.CDLL(None)
    start = time.monotonic()
    left = libc.sleep(seconds)
    return time.monotonic() - start, left, list(signals)


def sleeps_in_c_with_a_child(marks: str) -> None:
    """This rank and a child it forks (as a DataLoader forks its worker) both sleep in C, marking
    in ``marks`` when they start, any signal they count, and a sleep that ended early."""
    count_signals(marks)
    libc = ctypes.CDLL(None)
    child = os.fork()
    if child == 0:
        with open(marks, "a") as f:
            f.write(f"{os.getpid()} child asleep\n")
        left = libc.sleep(600)
        with open(marks, "a") as f:
            f.write(f"{os.getpid()} woke with {left} s left\n")
        os._exit(0)
    with open(marks, "a") as f:
        f.write(f"{os.getpid()} rank asleep\n")
    left = libc.sleep(600)
    with open(marks, "a") as f:
        f.write(f"{os.getpid()} woke with {left} s left\n")


def spins_holding_the_lock() -> None:
    if os.environ["RANK"] == "0":
        sum(range(10 ** 13))   # C code that never lets go of the interpreter lock
    time.sleep(600)


def blocks_holding_the_lock() -> None:
    if os.environ["RANK"] == "0":
        ctypes.PyDLL(None).sleep(600)   # C code that waits and keeps the lock (a PyDLL call does not release it)
    time.sleep(600)


# --- the tests ----------------------------------------------------------------------------------
@pytest.fixture
def ranks(tmp_path):
    with start_ranks(1, ui="text", log_dir=str(tmp_path / "logs"), use_port=str(free_port())) as pool:
        pool.run(count_signals)
        yield pool


def test_a_thread_storm_asked_a_thousand_times_is_unharmed(ranks):
    """Asked by signal, a rank whose threads were starting threads died of SIGSEGV after 13 and
    46 requests. Asked by its where-thread, it is alive after 1,000, with its state and no signal."""
    pids = ranks.pids
    ranks.run(keep, (41,))
    ranks.run(start_storm)
    before = ranks.run(storm_started)[0]
    reports = [ranks.stacks() for _ in range(REQUESTS)]
    started, counted = ranks.run(stop_storm)[0]
    assert counted == [], counted
    assert started > before   # the storm ran while it was asked
    assert ranks.pids == pids
    assert ranks.run(kept_plus_one) == [42]   # its state is there
    assert all("read by a signal" not in str(report) for report in reports)
    # Each answer says where the rank is; on a loaded machine the storm can keep the where-thread
    # from the lock past a request's wait: then the report says so, and that it was not signalled
    # (in a rehearsal beside four test workers and a Ray cluster the verdict once differed: no harm seen)
    expected = "no call is running: every rank waits for the next one"
    unanswered = [report.verdict for report in reports if report.verdict != expected]
    assert all("did not answer within" in verdict and "it was not signalled" in verdict for verdict in unanswered), \
        unanswered[:3]
    assert len(unanswered) < len(reports) / 2, unanswered[:3]   # asking works: most requests are answered


def test_a_rank_asleep_in_c_sleeps_its_full_time_while_asked(ranks):
    """``sleep(3)`` does not restart after a handled signal: asked by signal, a rank's sleep(40)
    returned after 3 s. Asked by its where-thread, it sleeps the whole time."""
    outcome: dict = {}

    def call() -> None:
        outcome["result"] = ranks.run(sleep_in_c, (4,))[0]

    caller = threading.Thread(target=call)
    caller.start()
    asked, seen = 0, False
    while caller.is_alive():
        report = ranks.stacks()
        asked += 1
        seen = seen or "sleep_in_c() at" in report.verdict
    caller.join()
    slept, left, counted = outcome["result"]
    assert seen and asked >= 2, (asked, seen)
    assert left == 0 and slept >= 4, (slept, left)
    assert counted == []


@pytest.mark.parametrize("holder, line", [(spins_holding_the_lock, "sum(range("),
                                          (blocks_holding_the_lock, "PyDLL(None).sleep(")])
def test_a_rank_holding_the_interpreter_lock_in_c_is_read_by_the_signal_and_the_verdict_says_so(holder, line, log_dir):
    """No thread of a rank whose lock C code holds (computing, or waiting) can answer: it is read
    by the signal (to its where-thread), and the verdict says so; the other rank answered itself."""
    with pytest.raises(LaunchError) as info:
        notebook_launcher(holder, num_processes=2, timeout=15, log_dir=log_dir, ui="text", use_port=str(free_port()))
    text = str(info.value)
    first = text.splitlines()[0]
    assert f"rank 0 is in {holder.__name__}() at {HERE}:{line_of(holder, line)}" in first, text
    assert first.endswith("(rank 0 read by a signal: no thread of it could answer (the interpreter lock was held "
                          "by C code))"), text
    rank0, rank1 = text.split("\nrank 0:\n")[1].split("\nrank 1:\n")
    assert "read by a signal" in rank0 and "read by a signal" not in rank1
    assert "main thread" in rank0


def test_no_way_of_asking_signals_a_rank_whose_lock_is_free(log_dir, tmp_path):
    """Every way the notebook collects stacks, then each one run against ranks asleep in C.

    The ways, all in ``diagnose`` (issue 31): ``diagnose.ranks.where_ranks`` (a launch's timeout,
    Stop, Ctrl-C and "Where are they?", a stall's report, elastic's attempts and through them other
    nodes, ``Ranks.stacks()``) asks each process through ``RankProcess.where`` where it answers for
    its ranks itself (XLA's launcher: ``engines.xla.replica_whereabouts``; a Ray actor or SLURM task:
    ``diagnose.remote_where``, answered from a thread over its connections by ``rank.reports.remote_where``:
    no signal) and every other
    rank by pid through ``stacks.collect``, as a stall's two stack samples do
    (``ranks.stack_fingerprints``); ``stacks.collect`` and ``native_stacks.child_stacks`` (a rank's
    forked children) both ask the where-thread over its wake pipe through ``where_thread.ask_all``;
    py-spy (``native_stacks.dump_all``, native frames) reads from outside by ptrace, which runs no
    handler. The one signal left is ``where_thread``'s fallback, behind ``lock_held``. Ray's way runs
    in test_a_ray_ranks_answer_signals_nothing."""
    ways = {"where_ranks", "process.where", "collect", "ask_all", "child_stacks", "dump_all", "asker.ask",
            "answerer.ask"}
    asking = {path.relative_to(PACKAGE).as_posix(): calls for path in PACKAGE.rglob("*.py")
              if (calls := _calls(path, ways | {"tgkill", "pthread_kill", "raise_signal"}))}
    collectors = {path: sorted(set(calls) & ways) for path, calls in asking.items()}
    assert {path: names for path, names in collectors.items() if names} == {
        "supervise/hang_watch.py": ["where_ranks"],   # the supervisor's HangWatch
        "persistent/whereabouts.py": ["where_ranks"],   # Ranks.stacks()
        "engines/elastic/node_board.py": ["collect"],   # the supervisor's whereabouts, for another node
        "diagnose/ranks.py": ["collect", "process.where"], "engines/xla/replica_whereabouts.py": ["collect"],
        "diagnose/stacks.py": ["ask_all"], "diagnose/native_stacks.py": ["ask_all", "child_stacks", "dump_all"],
        "engines/remote/serve.py": ["answerer.ask"],   # the rank's answering thread
        "rank/reports/remote_where.py": ["answerer.ask"],
        "engines/remote/handle.py": ["asker.ask"],   # Ray's and SLURM's ranks: diagnose.remote_where.WhereAsker
    }
    senders = {path: sorted(set(calls) & {"tgkill", "pthread_kill", "raise_signal"}) for path, calls in asking.items()}
    assert {path: names for path, names in senders.items() if names} == {
        "diagnose/where_thread.py": ["tgkill"],   # the fallback, behind lock_held
        "engines/remote/serve.py": ["pthread_kill"],   # the Stop button's SIGINT to a Ray rank's main thread
    }
    from notebook_launch.diagnose import native_stacks
    assert native_stacks.py_spy() is not None   # the dev venv has it (the test extra): its way runs below

    # A timeout, a stall (two samples and its report), py-spy and the forked child, all at once.
    marks = str(tmp_path / "marks")
    with pytest.raises(LaunchError) as info:
        notebook_launcher(sleeps_in_c_with_a_child, (marks,), num_processes=1, timeout=20, stall_after=1,
                          log_dir=log_dir, ui="text", use_port=str(free_port()))
    text = str(info.value)
    assert f"rank 0 is in sleeps_in_c_with_a_child() at {HERE}:" in text.splitlines()[0], text
    assert text.splitlines()[0].endswith("(left = libc.sleep(600))"), text
    assert "stalled for" in text and "its child, process" in text, text
    log = pathlib.Path(log_dir, "rank0.log").read_text()
    assert "where the ranks were (stalled: no rank showed progress for 1 s)" in log, log
    assert "where the ranks were (at the timeout)" in log, log
    lines = pathlib.Path(marks).read_text().splitlines()
    assert sorted(line.split(" ", 1)[1] for line in lines) == ["child asleep", "rank asleep"], lines


def test_the_lock_is_held_only_when_the_where_thread_waits_for_it_and_no_two_threads_run():
    """``where_thread.lock_held`` on /proc samples (thread id -> (ns run, times put on a CPU)); the
    where-thread is 9. It decides whether a silent rank is signalled."""
    from notebook_launch.diagnose.where_thread import lock_held
    before = {1: (0, 10), 9: (0, 5), 20: (0, 3)}
    ms = 1_000_000
    assert lock_held(before, {1: (150 * ms, 11), 9: (ms // 10, 45), 20: (0, 3)}, 9)       # 1 spins in C
    assert lock_held(before, {1: (0, 10), 9: (ms // 10, 45), 20: (0, 3)}, 9)              # 1 waits in C
    assert not lock_held(before, {1: (60 * ms, 30), 9: (ms // 10, 45), 20: (50 * ms, 25)}, 9)   # handed around
    assert not lock_held(before, {1: (0, 10), 9: (0, 5), 20: (0, 3)}, 9)                  # stopped: no wake
    assert not lock_held(before, {1: (0, 10), 9: (30 * ms, 9), 20: (0, 3)}, 9)            # answering
    assert not lock_held(before, {1: (150 * ms, 11)}, 9)                                   # no where-thread
    # threads starting and ending (a storm): each takes the lock, however briefly it runs
    assert not lock_held(before, {1: (ms, 11), 9: (ms // 10, 45), 20: (0, 3), 31: (ms, 2)}, 9)   # one started
    assert not lock_held(before, {1: (ms, 11), 9: (ms // 10, 45)}, 9)                      # one ended


def test_a_ray_ranks_answer_leaves_the_where_thread_out():
    """A Ray rank answers from a thread over its connections (``rank.reports.remote_where``); the where-thread
    every rank now has is ours, not the user's, and is not in that answer either. In a fresh
    process: installing registers a fork hook this test process must not keep."""
    import subprocess
    import sys
    code = ("import threading, types\n"
            "from notebook_launch.rank.reports import remote_where, where_thread, whereabouts\n"
            "whereabouts.install(types.SimpleNamespace(global_rank=0, env={}))\n"
            "ours = [t.ident for t in threading.enumerate() if t.name == where_thread.THREAD_NAME]\n"
            "answers = []\n"
            "asker = threading.Thread(target=lambda: answers.append(remote_where.snapshot()))\n"
            "asker.start(); asker.join()\n"   # the answering thread leaves itself out: not the main one
            "shown = [ident for ident, frames in answers[0]['threads']]\n"
            "print(len(ours), threading.main_thread().ident in shown, set(ours) & set(shown))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["1", "True", "set()"], out.stdout + out.stderr


def test_a_ray_ranks_answer_signals_nothing():
    """Ray's way of asking (``rank.reports.remote_where.Answerer``: a thread of the rank answers the request
    that came over its connection) never signals the rank: its main thread, blocked in C in a
    ``read(2)`` that a handled signal would end early (EINTR, -1), is asked 50 times while it is
    seen there, then let go by the asking side, and its read returns the byte, no signal counted.
    In a fresh process: installing registers a fork hook this test process must not keep."""
    import subprocess
    import sys
    code = ("import ctypes, os, signal, socket, threading, types\n"
            "from notebook_launch.channels import remote_where\n"
            "from notebook_launch.rank.reports import remote_where as rank_where, whereabouts\n"
            "whereabouts.install(types.SimpleNamespace(global_rank=0, env={}))\n"
            "counted = []\n"
            f"for signum in {[int(signum) for signum in COUNTED]}:\n"
            "    signal.signal(signum, lambda n, f: counted.append(n))\n"
            "r, w = os.pipe()\n"
            "notebook, rank = socket.socketpair()\n"
            "answerer = rank_where.Answerer(rank)\n"
            "def wait_in_c():\n"
            "    return ctypes.CDLL(None).read(r, ctypes.create_string_buffer(1), 1)\n"
            "def received(size):\n"
            "    data = b''\n"
            "    while len(data) < size:\n"
            "        data += notebook.recv(size - len(data))\n"
            "    return data\n"
            "def ask():\n"
            "    seen = number = 0\n"
            "    while seen < 50:\n"
            "        number += 1\n"
            "        answerer.ask(number)\n"
            "        _magic, answered, size = remote_where.REPLY.unpack(received(remote_where.REPLY.size))\n"
            "        data = remote_where.decode_body(received(size))\n"
            "        main = [frames for ident, frames in data['threads'] if ident == threading.main_thread().ident]\n"
            "        seen += answered == number and any(f[2] == 'wait_in_c' for f in main[0])\n"
            "    os.write(w, b'x')\n"
            "asker = threading.Thread(target=ask)\n"
            "asker.start()\n"
            "got = wait_in_c()\n"
            "asker.join()\n"
            "print(got, counted)\n")
    # a bounded wait: an asker that fails leaves the main thread in its read for good
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.split() == ["1", "[]"], out.stdout + out.stderr


def test_another_nodes_rank_read_by_the_signal_is_named_in_the_verdict_here():
    """Multi-node: a node posts its ranks' whereabouts for the node that diagnoses the hang; how
    each rank was read crosses with them, so the verdict there names a rank read by the signal."""
    from notebook_launch.engines.elastic.node_board import decode_whereabouts, encode_whereabouts
    from notebook_launch.diagnose.hang_verdict import Frame, RankWhereabouts, ThreadStack, verdict
    sent = [RankWhereabouts(3, threads=[ThreadStack(7, False, [Frame("train.py", 3, "spin")])], main_thread=7,
                            read_by="signal")]
    [got] = decode_whereabouts(encode_whereabouts(sent, lambda f: None), node=1)
    assert got.read_by == "signal"
    assert verdict([got], lambda f: None).endswith("(rank 3 read by a signal: no thread of it could answer (the "
                                                   "interpreter lock was held by C code))")


def _calls(path: pathlib.Path, names: set[str]) -> list[str]:
    """The names in ``names`` that ``path`` calls (as ``f(...)`` or ``x.f(...)``; a name given as ``x.f``,
    too common alone, as ``x.f(...)`` only); not ``gc.collect()``, which collects garbage, not stacks
    (rank/batch/batch_size frees a failed attempt's process group)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "gc":
                continue
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name in names:
                found.append(name)
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and \
                    f"{func.value.id}.{name}" in names:   # a name too common alone: with what it is called on
                found.append(f"{func.value.id}.{name}")
    return found
