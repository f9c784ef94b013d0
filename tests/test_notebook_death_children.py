"""Nothing a rank started outlives the notebook (issue 23 item 10).

A real Jupyter kernel is SIGKILLed (what a hard kernel restart does) while its ranks run, or
while persistent ranks wait between calls. The ranks die with it (PR_SET_PDEATHSIG); what they
started used to live on with ppid 1. Each rank here starts what users' code starts: a
``subprocess.Popen`` child (in the rank's process group), a DataLoader worker
(multiprocessing, same group), and a grandchild that ``setsid()``s away from the group (found
by the run's NOTEBOOK_LAUNCH_RUN_ID in its environment). The notebook's keeper
(``orphan_keeper``) must end all of them.

The one bound here is generous (60 s) against "a few seconds" by design: it only keeps a
broken build from hanging the suite; nothing is timed.
"""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import textwrap

import psutil
import pytest

from helpers.nbutil import running_kernel
from helpers.processes import running

GONE_WITHIN = 60

START_CHILDREN = textwrap.dedent('''
    _kept = []   # one entry per rank: XLA replicas are threads of one process

    def start_children(fifo):
        # One rank at a time: a DataLoader worker forked by one thread while another thread's Popen
        # waits for its child's exec inherits that Popen's error pipe and keeps it open, so the Popen
        # waits as long as the worker lives (CPython's, not ours: XLA replicas are threads). Made
        # here, not as a global: persistent ranks get this function pickled, and a lock does not pickle.
        import threading
        with globals().setdefault("_one_rank_at_a_time", threading.Lock()):
            return _start_children(fifo)

    def _start_children(fifo):
        """Start a Popen child, a DataLoader worker and a setsid grandchild; report their pids
        through ``fifo``; keep them (and the DataLoader's iterator) alive."""
        import os, subprocess, sys, torch
        from torch.utils.data import DataLoader
        popen = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        escaped = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                                   start_new_session=True)
        loader = iter(DataLoader(list(range(100)), num_workers=1, batch_size=1, persistent_workers=True))
        next(loader)
        workers = [w.pid for w in loader._workers]
        _kept.append((popen, escaped, loader))
        with open(fifo, "w") as f:
            f.write(" ".join(map(str, [os.getpid(), popen.pid, escaped.pid] + workers)) + "\\n")
        return os.getpid()
''')


def read_pids(fifo: str, expected_lines: int) -> list[int]:
    """The pids the ranks wrote to ``fifo`` (each rank one line, one write: atomic in a pipe).
    Opened read-write, so that between two writers the fifo never reads as hung up."""
    fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
    data = b""
    try:
        while data.count(b"\n") < expected_lines:
            ready, _, _ = select.select([fd], [], [], 240)
            assert ready, "the ranks never reported their children"
            try:
                data += os.read(fd, 4096)
            except BlockingIOError:   # woken with nothing to read after all
                continue
    finally:
        os.close(fd)
    return [int(p) for p in data.split()]


@pytest.fixture
def kernel(tmp_path):
    with running_kernel(str(tmp_path)) as started:
        yield started


def kill_kernel_and_check(km, pids: list[int]) -> None:
    processes = []
    for pid in pids:
        try:
            processes.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    assert len(processes) == len(pids), "a child ended before the kernel was killed"
    os.kill(km.provisioner.process.pid, signal.SIGKILL)   # a hard restart: no cleanup code runs
    _, alive = psutil.wait_procs(processes, timeout=GONE_WITHIN)
    alive = running(alive)
    assert alive == [], f"left running after the notebook died: {[(p.pid, p.cmdline()) for p in alive]}"


def launch_ranks_that_start_children(client, tmp_path, launch_options: str, ranks: int) -> list[int]:
    """In the kernel, a launch (``notebook_launcher(train, <launch_options>)``) whose ``ranks`` ranks
    start children and sleep; the pids they report (4 per rank)."""
    fifo = str(tmp_path / "pids")
    os.mkfifo(fifo)
    client.execute(START_CHILDREN + textwrap.dedent(f'''
        import time
        from notebook_launch import notebook_launcher
        def train():
            start_children({fifo!r})
            time.sleep(600)
        notebook_launcher(train, {launch_options})
    '''))
    pids = read_pids(fifo, ranks)
    assert len(pids) == 4 * ranks
    return pids


def test_a_killed_kernel_leaves_nothing_a_launch_started(kernel, tmp_path):
    km, client = kernel
    pids = launch_ranks_that_start_children(client, tmp_path, 'num_processes=2, ui="none"', ranks=2)
    kill_kernel_and_check(km, pids)


def test_a_killed_kernel_leaves_nothing_persistent_ranks_started(kernel, tmp_path):
    km, client = kernel
    fifo = str(tmp_path / "pids")
    os.mkfifo(fifo)
    client.execute(START_CHILDREN + textwrap.dedent(f'''
        from notebook_launch import start_ranks
        ranks = start_ranks(2, ui="none")
        ranks.run(start_children, args=({fifo!r},))   # they stay, between calls
    '''))
    pids = read_pids(fifo, 2)
    assert len(pids) == 8
    kill_kernel_and_check(km, pids)


# The notebook's side of a launch, in a process of its own: it starts a rank-like group and an
# escaped process (as a rank's children would be), registers them with the keeper the way a
# launch does (leftovers.guard), and dies at once by SIGKILL. The keeper is held at its gate
# (a FIFO the test opens) until the notebook is dead, so it reads its orders only afterwards.
NOTEBOOK_DIES_FIRST = textwrap.dedent('''
    import os, signal, subprocess, sys
    from notebook_launch.process import leftovers
    leftovers._KEEPER_PROGRAM = {gate_program!r}
    run_id = "keeper-race-" + str(os.getpid())
    sleep = [sys.executable, "-c", "import time; time.sleep(600)"]
    group = subprocess.Popen(sleep, start_new_session=True)            # a rank's group
    other = subprocess.Popen(sleep, start_new_session=True)            # another rank's
    escaped = subprocess.Popen(sleep, start_new_session=True,          # left the group, carries the run
                               env=dict(os.environ, NOTEBOOK_LAUNCH_RUN_ID=run_id))
    print(group.pid, other.pid, escaped.pid, flush=True)
    leftovers.guard(run_id, group.pid, other.pid)   # one order for the launch's ranks; no wait for the keeper
    print("registered", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
''')

# Runs the real keeper once the test opens the gate: the same pid, fds and arguments (exec).
GATE_PROGRAM = textwrap.dedent('''
    import os, sys
    with open({gate!r}) as gate:
        gate.read()
    os.execv(sys.executable, [sys.executable, "-I", "-S", {keeper!r}] + sys.argv[1:])
''')


def test_a_notebook_that_dies_before_its_keeper_is_ready_leaves_nothing(tmp_path):
    """The launch does not wait for the keeper to start (a fresh interpreter: tens of ms of every
    first launch); the orders it wrote meanwhile wait in the keeper's socket, which outlives the
    notebook, and the keeper reads them before it acts on the notebook's death. Without that
    (a launch that waits for its keeper) the notebook here never gets past ``guard``."""
    from notebook_launch.process import leftovers
    gate = str(tmp_path / "gate")
    os.mkfifo(gate)
    gate_program = tmp_path / "gated_keeper.py"
    gate_program.write_text(GATE_PROGRAM.format(gate=gate, keeper=leftovers._KEEPER_PROGRAM))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    notebook = subprocess.Popen([sys.executable, "-c", NOTEBOOK_DIES_FIRST.format(gate_program=str(gate_program))],
                                stdout=subprocess.PIPE, env=env)
    pids: list[int] = []
    try:
        assert notebook.stdout is not None
        pids = [int(p) for p in notebook.stdout.readline().split()]
        assert len(pids) == 3, pids
        ready, _, _ = select.select([notebook.stdout], [], [], 240)
        assert ready, "the notebook never got past leftovers.guard: it waits for its keeper"
        assert notebook.stdout.readline() == b"registered\n"
        assert notebook.wait(timeout=240) == -signal.SIGKILL
        processes = [psutil.Process(pid) for pid in pids]   # alive, orphaned, the notebook gone
        with open(gate, "w") as opened:   # now the keeper may start
            opened.write("go")
        _, alive = psutil.wait_procs(processes, timeout=GONE_WITHIN)
        alive = running(alive)
        assert alive == [], f"left running after the notebook died: {[p.pid for p in alive]}"
    finally:
        try:   # a gated keeper still waiting goes on (and ends what it was told of)
            os.close(os.open(gate, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass   # nobody is waiting at the gate
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if notebook.poll() is None:
            notebook.kill()
            notebook.wait()


# A first launch in a fresh process, recording in order the keeper's start and each rank's fork.
FIRST_LAUNCH_ORDER = textwrap.dedent('''
    import json
    from notebook_launch import notebook_launcher
    from notebook_launch.engines.local import fork
    from notebook_launch.process import leftovers
    events = []
    start_keeper, fork_ranks = leftovers._start_keeper, fork.fork_all_from_clean_thread

    def recorded_start_keeper():
        events.append("keeper")
        return start_keeper()

    def recorded_fork(children):
        events.extend("fork" for _ in children)
        return fork_ranks(children)

    leftovers._start_keeper, fork.fork_all_from_clean_thread = recorded_start_keeper, recorded_fork
    results = notebook_launcher(int, num_processes=3, ui="none", log_dir={log_dir!r})
    print(json.dumps({{"results": results, "events": events, "keeper": bool(leftovers.keeper_fds())}}))
''')


def fresh_notebook_outcome(script: str, tmp_path) -> tuple[dict, str]:
    """``script`` (formatted with ``log_dir``) in a new interpreter with this tree first on the
    path: the JSON its last line prints, and its stderr."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", script.format(log_dir=str(tmp_path))],
                          capture_output=True, text=True, env=env, timeout=240)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1]), done.stderr


def test_the_first_launch_starts_its_keeper_before_any_rank(tmp_path):
    """The keeper (a fresh interpreter) starts before the first rank is forked, not between the
    first two forks, where its start held the second fork up and the first rank ran a moment with
    no keeper to register with; started once (each rank's registration finds it)."""
    outcome, stderr = fresh_notebook_outcome(FIRST_LAUNCH_ORDER, tmp_path)
    assert outcome == {"results": [0, 0, 0], "events": ["keeper", "fork", "fork", "fork"], "keeper": True}, \
        (outcome, stderr)


REFUSED_THEN_LAUNCHED = textwrap.dedent("""
    import json, time
    import psutil
    from notebook_launch import LaunchArgumentError, notebook_launcher

    def children():
        return [c.status() for c in psutil.Process().children()]

    try:
        notebook_launcher(int, num_processes=2, display_ranks=[5], ui="none", log_dir={log_dir!r})
        refused = False
    except LaunchArgumentError:
        refused = True
    after_refusal = children()
    results = notebook_launcher(int, args=("1",), num_processes=2, ui="none", log_dir={log_dir!r})
    deadline = time.monotonic() + 20
    while children() and time.monotonic() < deadline:
        time.sleep(0.05)
    print(json.dumps({{"refused": refused, "after_refusal": after_refusal, "results": results,
                       "after_launch": children()}}))
""")


def test_a_refused_launch_starts_no_keeper_and_the_keepers_first_process_is_reaped_at_once(tmp_path):
    """A launch its last check refuses (display_ranks naming a rank the run lacks) starts nothing,
    the keeper included: it started once the port was settled, before that check, and its first
    process, which exits once the keeper forked, stayed a zombie child until the next launch. After
    a launch nothing is left as the notebook's child: its ranks and the keeper's first process are
    reaped without another launch (the keeper itself is no child: it left in a new session)."""
    outcome, _ = fresh_notebook_outcome(REFUSED_THEN_LAUNCHED, tmp_path)
    assert outcome == {"refused": True, "after_refusal": [], "results": [1, 1], "after_launch": []}, outcome
