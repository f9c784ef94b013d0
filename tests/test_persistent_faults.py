"""Persistent ranks under faults (issue 23, section A): an interrupt while a call's frame goes
out or while a rank sends its outcome, output between calls, a failure while ranks still
start, what ranks start, %%ranks values that do not pickle, a pool shared by threads.
Real forked ranks; synchronisation through marker files, never sleeps."""
import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from notebook_launch import LaunchError, start_ranks
from notebook_launch.planning.net import free_port
from notebook_launch.channels import commands
from notebook_launch.persistent import command_frames
from notebook_launch.rank import runner

from helpers.fd_helpers import fd_links
from helpers.processes import children, running

pytestmark = pytest.mark.timeout(180)
WAIT = 60   # seconds a condition may take on a busy machine before the test gives up


def wait_for(condition, what):
    """Poll ``condition`` (a marker file, a process gone): the bound only stops a broken run."""
    deadline = time.monotonic() + WAIT
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.01)


def alive(pid):
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def our_children():
    return running(children())


# --- functions the ranks run (importable: they travel by reference) ------------------------

kept: int   # a rank's pid, once set_state() ran in it (declared only: no rank has it before)


def set_state():
    global kept
    kept = os.getpid()
    return kept


def read(name):
    return globals().get(name, "missing")


def add(name, value):
    globals()[name] = globals().get(name, 0) + value
    return globals()[name]


def touch(path):
    open(path, "w").close()


class SlowToSend:
    """A result whose pickling waits until the test has interrupted the notebook: the rank
    is then sending its outcome when the interrupt comes (as with a big result)."""

    def __init__(self, go):
        self.go = go

    def __reduce__(self):
        touch(os.path.join(os.path.dirname(self.go), f"returning{os.environ['RANK']}"))
        while not os.path.exists(self.go):
            time.sleep(0.01)
        return bytes, (b"x" * (8 << 20),)


def return_slowly(marker_dir):
    return SlowToSend(os.path.join(marker_dir, "go"))


class SlowToDescribe(Exception):
    """An exception whose text waits until the test has interrupted the notebook."""

    def __str__(self):
        while not os.path.exists(self.args[0]):
            time.sleep(0.01)
        return "described at last"


def raise_slowly(marker_dir):
    touch(os.path.join(marker_dir, f"returning{os.environ['RANK']}"))
    raise SlowToDescribe(os.path.join(marker_dir, "go"))


def chatter_in_the_background(marker_dir, lines):
    """A thread that prints far more than a pipe holds once the call is over (the test
    says so with a file)."""
    def talk():
        while not os.path.exists(os.path.join(marker_dir, "go")):
            time.sleep(0.01)
        for i in range(lines):
            print(f"background line {i} " + "." * 100)
        print("the background thread's last line", flush=True)
        touch(os.path.join(marker_dir, f"printed{os.environ['RANK']}"))
    threading.Thread(target=talk, daemon=True).start()
    return True


def start_children():
    """A child in the rank's process group and one that left it (a new session)."""
    grouped = subprocess.Popen(["sleep", "600"])
    detached = subprocess.Popen(["sleep", "600"], start_new_session=True)
    return grouped.pid, detached.pid


def fail_while_others_start(marker_dir):
    rank = int(os.environ["RANK"])
    if rank == 2:
        while not os.path.exists(os.path.join(marker_dir, "running0")):
            time.sleep(0.01)
        raise ValueError("rank 2 fails while rank 1 still starts")
    touch(os.path.join(marker_dir, f"running{rank}"))
    try:
        while True:
            time.sleep(0.01)
    except KeyboardInterrupt:
        touch(os.path.join(marker_dir, f"interrupted{rank}"))
        raise


@pytest.fixture
def ranks(log_dir):
    with start_ranks(2, ui="none", log_dir=log_dir, interrupt_grace=2.0, use_port=free_port()) as pool:
        yield pool
    assert our_children() == []


# --- 1. an interrupt while a call's frame is being sent ------------------------------------

def interrupting_send(monkeypatch):
    """commands.send as it is, except that a SIGINT reaches this process (what the kernel's
    interrupt is) once part of the frame is written: the interrupt lands mid-frame."""
    real = commands.send
    sent: list[int] = []   # the fd of the one frame cut by the interrupt

    def send(fd, frame):
        if sent:
            return real(fd, frame)
        sent.append(fd)
        data = frame if isinstance(frame, bytes) else frame.data
        half = len(data) // 2
        real(fd, data[:half] if isinstance(frame, bytes) else type(frame)(data[:half], frame.tensors))
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):   # the signal's handler runs at one of these bytecodes
            pass
        real(fd, data[half:])

    monkeypatch.setattr(commands, "send", send)
    return sent


@pytest.mark.parametrize("how", ["push", "run arguments", "run_cell values"])
def test_an_interrupt_while_a_call_is_sent_leaves_the_channel_whole(ranks, monkeypatch, how):
    pids = ranks.pids
    states = ranks.run(set_state)
    big = b"y" * (4 << 20)   # larger than a pipe: the frame goes out in many writes
    sent = interrupting_send(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        if how == "push":
            ranks.push(big=big)
        elif how == "run arguments":
            ranks.run(len, args=(big,))
        else:
            ranks.run_cell("seen = len(big)", "<cell>", {"big": big})
    assert sent, "the interrupt was sent mid-frame"
    monkeypatch.undo()
    assert ranks.run(read, args=("kept",), timeout=WAIT) == states   # the next call works, state kept
    assert ranks.pids == pids and ranks.alive and ranks.restarts == 0
    assert ranks.run(read, args=("big",)) == ["missing", "missing"]   # the interrupted call did not run
    ranks.push(big=big)
    assert ranks.run(read, args=("kept",)) == states


# --- 2. an interrupt while the ranks send their outcome -------------------------------------

def pull_slowly(ranks, marker_dir):
    ranks.run_cell("slow = SlowToSend(go)", "<cell>", {"SlowToSend": SlowToSend,
                                                     "go": os.path.join(marker_dir, "go")})
    return ranks.pull("slow")


@pytest.mark.parametrize("how", ["return", "raise", "pull"])
def test_an_interrupt_while_ranks_send_their_outcome_keeps_them(log_dir, tmp_path, how):
    """The grace is for code that does not come back; a rank sending its result (or its
    exception) is past its code, so it is waited for, however long the transfer takes."""
    with start_ranks(2, ui="none", log_dir=log_dir, interrupt_grace=0.05, use_port=free_port()) as ranks:
        states = ranks.run(set_state)
        pids = ranks.pids
        marker_dir = str(tmp_path)

        def interrupt():
            wait_for(lambda: all(os.path.exists(os.path.join(marker_dir, f"returning{r}")) for r in range(2)),
                     "the ranks to return")
            os.kill(os.getpid(), signal.SIGINT)
            # The ranks stay in their report well past the grace (20x): before the fix the grace
            # ended them. The fix does not depend on this wait: they are waited for, however long.
            time.sleep(1.0)
            touch(os.path.join(marker_dir, "go"))

        thread = threading.Thread(target=interrupt, daemon=True)
        thread.start()
        with pytest.raises(KeyboardInterrupt):
            if how == "pull":
                pull_slowly(ranks, marker_dir)
            else:
                ranks.run(return_slowly if how == "return" else raise_slowly, args=(marker_dir,))
        thread.join()
        assert ranks.pids == pids and ranks.alive and ranks.restarts == 0
        assert ranks.run(read, args=("kept",)) == states
    assert our_children() == []


# --- 4. output between calls ----------------------------------------------------------------

def test_output_of_a_background_thread_flows_between_calls(log_dir, tmp_path, capsys):
    marker_dir = str(tmp_path)
    with start_ranks(2, ui="text", log_dir=log_dir, use_port=free_port()) as ranks:
        ranks.run(chatter_in_the_background, args=(marker_dir, 2000))   # ~200 KiB a rank, after the call
        touch(os.path.join(marker_dir, "go"))
        wait_for(lambda: all(os.path.exists(os.path.join(marker_dir, f"printed{r}")) for r in range(2)),
                 "the background threads to print everything (a full pipe blocks them)")
        ranks.run(read, args=("kept",))
    for rank in range(2):
        log = open(os.path.join(log_dir, f"rank{rank}.log")).read()
        assert log.count("background line ") == 2000
        assert "the background thread's last line" in log
    shown = capsys.readouterr().out
    assert "[rank 1] the background thread's last line" in shown   # also in the notebook (no cells here)


def test_what_a_rank_prints_after_the_last_call_reaches_its_log(log_dir, tmp_path):
    marker_dir = str(tmp_path)
    with start_ranks(2, ui="none", log_dir=log_dir, use_port=free_port()) as ranks:
        ranks.run(chatter_in_the_background, args=(marker_dir, 10))
        touch(os.path.join(marker_dir, "go"))
        wait_for(lambda: all(os.path.exists(os.path.join(marker_dir, f"printed{r}")) for r in range(2)),
                 "the background threads")
    for rank in range(2):
        assert "the background thread's last line" in open(os.path.join(log_dir, f"rank{rank}.log")).read()


# --- 5. a failure while ranks still start ---------------------------------------------------

def test_a_failure_while_a_rank_still_starts_keeps_every_rank(log_dir, tmp_path):
    """Rank 2 fails while rank 0 runs and rank 1 is still starting (held in a start hook until
    rank 0 was interrupted): rank 1 has no handler of ours yet, so it must not get a SIGINT;
    it takes the interrupt as its call starts, and every rank lives on."""
    marker_dir = str(tmp_path)

    def hold_rank_1(spec):
        if spec.global_rank == 1:
            while not os.path.exists(os.path.join(marker_dir, "interrupted0")):
                time.sleep(0.01)

    runner.rank_hooks.append(hold_rank_1)
    try:
        ranks = start_ranks(3, ui="none", log_dir=log_dir, interrupt_grace=WAIT, use_port=free_port())
    finally:
        runner.rank_hooks.remove(hold_rank_1)
    with ranks:
        pids = ranks.pids
        with pytest.raises(LaunchError) as caught:
            ranks.run(fail_while_others_start, args=(marker_dir,))
        assert caught.value.rank == 2
        assert "still running, with their state" in str(caught.value)
        assert ranks.pids == pids and ranks.alive and ranks.restarts == 0
        assert ranks.run(set_state) == pids


def test_a_rank_that_dies_when_interrupted_is_reported_lost(log_dir, tmp_path):
    """However a rank ends during a call (here: on our interrupt), the error says the ranks
    are gone, never that they are still running."""
    with start_ranks(2, ui="none", log_dir=log_dir, interrupt_grace=WAIT, use_port=free_port()) as ranks:
        with pytest.raises(LaunchError) as caught:
            ranks.run(die_when_interrupted, args=(str(tmp_path),))
        assert "still running" not in str(caught.value)
        assert "The next call starts fresh ranks" in str(caught.value)


def die_when_interrupted(marker_dir):
    rank = int(os.environ["RANK"])
    if rank == 1:
        while not os.path.exists(os.path.join(marker_dir, "running0")):
            time.sleep(0.01)
        raise ValueError("rank 1 fails")
    touch(os.path.join(marker_dir, "running0"))
    try:
        while True:
            time.sleep(0.01)
    except KeyboardInterrupt:
        os._exit(3)


# --- 6. what the ranks started ----------------------------------------------------------------

def test_what_ranks_started_ends_with_close(log_dir):
    ranks = start_ranks(2, ui="none", log_dir=log_dir, use_port=free_port())
    started = [pid for pair in ranks.run(start_children) for pid in pair]
    assert all(alive(pid) for pid in started)
    ranks.close()   # SIGKILL is sent by then; dying takes the kernel a moment
    wait_for(lambda: not any(alive(pid) for pid in started), "what the ranks started to end")
    assert our_children() == []


def test_what_a_rank_started_ends_when_the_rank_dies_between_calls(ranks):
    started = ranks.run(start_children)
    grouped, _ = started[0]
    os.kill(ranks.pids[0], signal.SIGKILL)
    wait_for(lambda: not alive(grouped), "the dead rank's child to end")   # before any next call
    ranks.run(read, args=("kept",))   # the restart sweeps what left the group
    wait_for(lambda: not any(alive(pid) for pair in started for pid in pair), "the detached children to end")


# --- 7. %%ranks values that do not pickle ------------------------------------------------------

def test_a_cell_value_that_does_not_pickle_is_named_before_running(ranks, capsys):
    lock = threading.Lock()
    with pytest.raises(LaunchError) as caught:
        ranks.run_cell("lk.acquire(); ran = True", "<cell>", {"lk": lock, "n": 3})
    shown = capsys.readouterr().out
    assert "not sent to the ranks: lk (TypeError: cannot pickle '_thread.lock' object)" in shown
    assert "name 'lk' is not defined in this rank: the notebook's value could not be sent" in str(caught.value)
    with pytest.raises(LaunchError, match="'ran' not defined"):
        ranks.pull("ran")   # the cell did not run
    ranks.run_cell("import threading\nlk = threading.Lock()", "<cell>", {})
    ranks.run_cell("ran = lk.acquire(blocking=False) and n", "<cell>", {"lk": lock, "n": 3})
    assert ranks.pull("ran") == [3, 3]   # the ranks' own lk, the notebook's n


# --- 8. a pool shared by threads ---------------------------------------------------------------

def test_calls_from_several_threads_run_one_at_a_time(ranks):
    start = sorted(fd_links())
    errors, results = [], []

    def worker():
        try:
            for _ in range(15):
                results.append(ranks.run(add, args=("counter", 1)))
                ranks.push(last=threading.get_ident())
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert all(r[0] == r[1] for r in results)
    assert sorted(r[0] for r in results) == list(range(1, 46))
    assert ranks.run(read, args=("counter",)) == [45, 45]
    assert sorted(fd_links()) == start


def test_close_from_another_thread_waits_for_the_running_call(log_dir, tmp_path):
    marker = str(tmp_path / "running")
    ranks = start_ranks(2, ui="none", log_dir=log_dir, use_port=free_port())
    closer = threading.Thread(target=lambda: (wait_for(lambda: os.path.exists(marker), "the call"),
                                              ranks.close()))
    closer.start()
    assert ranks.run(touch_and_wait, args=(marker, str(tmp_path / "closing"))) == [True, True]
    closer.join()
    assert ranks.closed and our_children() == []


def touch_and_wait(marker, closing):
    touch(marker)
    for _ in range(50):   # the closer waits for the lock meanwhile
        time.sleep(0.01)
    return True


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


# --- 3. tensors at memory speed, both ways --------------------------------------------------

def scale_in_place(name, factor):
    import __main__
    getattr(__main__, name).mul_(factor)
    return float(getattr(__main__, name)[0])


def echo(value):
    return value


def test_tensors_cross_through_memfds_both_ways(ranks, monkeypatch):
    import torch

    from notebook_launch.rank.serve import Call
    from notebook_launch.rank.runner import Job
    big = torch.arange(16 << 20, dtype=torch.float32)   # 64 MiB
    frame = command_frames.encode(commands.Command.CALL, Call(Job(echo, (big, big[:10]))))
    try:
        assert frame.tensors is not None and os.fstat(frame.tensors).st_size >= big.nbytes
        assert len(frame.data) < 1 << 20        # the bytes are in the memfd, not in the frame
    finally:
        frame.close()
    passed = []
    real_take = commands.take_result_file

    def take(fd, number):
        found = real_take(fd, number)
        passed.append(found is not None)
        return found

    monkeypatch.setattr(commands, "take_result_file", take)
    start = sorted(fd_links())
    ranks.push(weights=big)
    assert ranks.run(scale_in_place, args=("weights", 2.0)) == [0.0, 0.0]
    assert float(big[1]) == 1.0                   # the ranks' copy is theirs
    assert passed == []   # no tensor in push's and run's results: no file, so none was taken (call._with_files)
    passed.clear()
    back = ranks.pull("weights")
    assert passed == [True, True]                 # the results came back through memfds
    assert all(torch.equal(t, big * 2) for t in back)
    back[0].add_(1)                               # and the notebook's copy is its own
    assert torch.equal(ranks.pull("weights")[1], big * 2)
    whole, view = ranks.run(echo, args=((big, big[5:7]),))[0]
    assert torch.equal(whole, big) and view.untyped_storage().data_ptr() == whole.untyped_storage().data_ptr()
    del back, whole, view
    assert sorted(fd_links()) == start


# --- 9. an interrupt that had to stop the ranks says so in the cell ---------------------------

def rank_0_in_a_barrier_rank_1_in_python(marker_dir):
    """Rank 0 waits in a gloo barrier rank 1 never joins (an interrupt does not bring it back);
    rank 1 waits in Python (it comes back from the interrupt)."""
    import torch.distributed as dist
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    if dist.get_rank() == 0:
        dist.barrier()
    touch(os.path.join(marker_dir, "running1"))
    while True:
        time.sleep(0.01)


@pytest.mark.parametrize("how", ["Ctrl-C", "Stop"])
def test_an_interrupt_that_stopped_the_ranks_says_their_state_is_gone(ranks, tmp_path, how):
    """Before, a kernel interrupt (or Stop) that had to kill the ranks, one being in gloo past the
    grace, ended the cell with a bare KeyboardInterrupt: nothing said the state was gone."""
    from helpers.waiting import inside_collective
    pids = ranks.pids

    def interrupt():
        wait_for(lambda: inside_collective(pids[0], "barrier") and os.path.exists(tmp_path / "running1"),
                 "rank 0 in the barrier and rank 1 in its loop")
        if how == "Ctrl-C":
            os.kill(os.getpid(), signal.SIGINT)   # what the kernel's interrupt is
        else:
            ranks._supervisor.state.stop_requested = True   # what the panel's Stop button does
    thread = threading.Thread(target=interrupt, daemon=True)
    thread.start()
    with pytest.raises(KeyboardInterrupt) as caught:
        ranks.run(rank_0_in_a_barrier_rank_1_in_python, args=(str(tmp_path),))
    thread.join()
    message = str(caught.value)
    assert "Every rank was stopped because rank 0 did not come back within 2 s of the interrupt" in message
    assert "The next call starts fresh ranks; their state (models, variables, process group) is lost." in message
    assert not ranks.alive and not any(alive(pid) for pid in pids)
    assert ranks.run(os.getpid) != pids   # fresh ranks
