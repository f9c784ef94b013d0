"""A call's frame goes to the ranks before the call's run state, session and supervisor are
built (issue 45), so an interrupt can land before, during or after that send, or while the
bookkeeping is built. Wherever it lands, the notebook gets KeyboardInterrupt, the ranks were
interrupted or never began the call, no frame is left half sent, the ranks keep their state
for the next call, the notebook's SIGINT handler is its own again and no fd is left open.
A set-up that fails once the frame is out stops the ranks (no one would read that call's
outcome) and the next call runs on fresh ones.

Real forked ranks and a real SIGINT to this process (what the kernel's interrupt is), sent
by a hook at each chosen point; the ranks' function waits on a marker file that never comes,
so a call the ranks began ends only if they are interrupted. No sleeps as synchronisation."""
import os
import signal
import time

import pytest

from helpers.fd_helpers import fd_links
from helpers.processes import children, running
from notebook_launch import start_ranks
from notebook_launch.channels import commands
from notebook_launch.persistent import pool as pool_module
from notebook_launch.planning.net import free_port
from notebook_launch.scaffold import session as session_module

pytestmark = pytest.mark.timeout(180)
WAIT = 60   # seconds a call may take on a busy machine before the test gives up


# --- what the ranks run (importable: they travel by reference) ------------------------------

kept: int   # a rank's pid, once keep() ran in it


def keep():
    global kept
    kept = os.getpid()
    return kept


def read(name):
    return globals().get(name, "missing")


def hold(marker_dir):
    """Begin (a marker says so), then wait for a file no one writes: only an interrupt ends it."""
    open(os.path.join(marker_dir, f"began{os.environ['RANK']}"), "w").close()
    while not os.path.exists(os.path.join(marker_dir, "never")):
        time.sleep(0.01)


# --- where the interrupt lands ----------------------------------------------------------------

def interrupt_here():
    """SIGINT to this process; its Python handler runs at one of the loop's bytecodes, so
    it lands here and not later."""
    os.kill(os.getpid(), signal.SIGINT)
    for _ in range(1000):
        pass


def around(owner, name, monkeypatch, before=False, after=False):
    """``owner.name`` as it is, with an interrupt landing just before or just after it."""
    real = getattr(owner, name)

    def hooked(*args, **kwargs):
        if before:
            interrupt_here()
        value = real(*args, **kwargs)
        if after:
            interrupt_here()
        return value

    monkeypatch.setattr(owner, name, hooked)


def mid_frame(monkeypatch):
    """commands.send writes half of the first rank's frame, is interrupted, then writes the rest."""
    real = commands.send
    cut: list[int] = []

    def send(fd, frame):
        if cut or not isinstance(frame, commands.Frame):
            return real(fd, frame)
        cut.append(fd)
        half = len(frame.data) // 2
        real(fd, commands.Frame(frame.data[:half], frame.tensors))
        interrupt_here()
        real(fd, frame.data[half:])

    monkeypatch.setattr(commands, "send", send)


class InterruptedSupervisor(pool_module.CallSupervisor):
    """The call's supervisor, an interrupt landing once it is built, before its first turn."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        interrupt_here()


POINTS = {
    "before the call's guard": lambda ranks, mp: around(ranks._life, "ensure_running", mp, after=True),
    "as the frame is about to go out": lambda ranks, mp: around(ranks.transport, "send", mp, before=True),
    "in the middle of the frame": lambda ranks, mp: mid_frame(mp),
    "once the frame is out": lambda ranks, mp: around(ranks.transport, "send", mp, after=True),
    "while the call's run state is built": lambda ranks, mp: around(pool_module, "plan_state", mp, after=True),
    "while the call's display is made": lambda ranks, mp: around(session_module, "choose_display", mp, after=True),
    "once the supervisor is built": lambda ranks, mp: mp.setattr(pool_module, "CallSupervisor",
                                                                 InterruptedSupervisor),
}


@pytest.fixture
def ranks(log_dir):
    with start_ranks(2, ui="none", log_dir=log_dir, interrupt_grace=30.0, use_port=free_port()) as pool:
        yield pool
    assert running(children()) == []


@pytest.fixture
def sigint_raises():
    """SIGINT raises KeyboardInterrupt here, as in a kernel, however the test run was started
    (a shell without job control starts it with SIGINT ignored)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


@pytest.mark.parametrize("point", list(POINTS))
def test_an_interrupt_around_the_early_send_keeps_the_ranks(ranks, monkeypatch, tmp_path, sigint_raises, point):
    states = ranks.run(keep)
    pids = ranks.pids
    handler = signal.getsignal(signal.SIGINT)
    fds = sorted(fd_links())
    POINTS[point](ranks, monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        ranks.run(hold, args=(str(tmp_path),), timeout=WAIT)
    monkeypatch.undo()
    began = sorted(p.name for p in tmp_path.glob("began*"))
    if point == "before the call's guard":
        assert began == [], "the call was never sent, so no rank began it"
    assert signal.getsignal(signal.SIGINT) is handler
    assert ranks.pids == pids and ranks.alive and ranks.restarts == 0
    assert ranks.run(read, args=("kept",), timeout=WAIT) == states   # in step, with their state
    assert sorted(fd_links()) == fds


def test_a_set_up_that_fails_after_the_send_restarts_the_ranks(ranks, monkeypatch, tmp_path):
    """No supervisor reads the call's outcome, which the next call would take for its own: the
    ranks are stopped, saying why, and the next call starts fresh ones."""
    pids = ranks.pids
    ranks.run(keep)

    def broken(*args, **kwargs):
        raise RuntimeError("the run state could not be built")

    monkeypatch.setattr(pool_module, "plan_state", broken)
    with pytest.raises(RuntimeError, match="could not be built"):
        ranks.run(hold, args=(str(tmp_path),), timeout=WAIT)
    monkeypatch.undo()
    assert not ranks.alive and "failed after it was sent to them (RuntimeError" in repr(ranks)
    assert ranks.run(read, args=("kept",), timeout=WAIT) == ["missing", "missing"]   # fresh ranks
    assert ranks.restarts == 1 and set(ranks.pids).isdisjoint(pids)
