"""Every rank of a launch forked in one turn of the fork helper (``fork_all_from_clean_thread``,
issue 45): each child's pid and its pidfd, in order; and a turn that fails part way leaves no child
behind and no pidfd open."""
import os

import pytest

from notebook_launch.engines.local import fork_thread


def exiting_with(code: int):
    def child():
        os._exit(code)
    return child


def open_fds() -> set[int]:
    return {int(name) for name in os.listdir("/proc/self/fd")}


def test_each_child_comes_back_in_order_with_its_pidfd():
    forked = fork_thread.fork_all_from_clean_thread([exiting_with(code) for code in (3, 4, 5)])
    try:
        assert len(forked) == 3
        for (pid, pidfd), code in zip(forked, (3, 4, 5)):
            assert os.waitpid(pid, 0)[1] >> 8 == code   # each pid is that child's, in order
            os.fstat(pidfd)   # open
    finally:
        for _, pidfd in forked:
            os.close(pidfd)


def test_a_turn_that_fails_part_way_ends_what_it_forked(monkeypatch):
    """A stand-in for a pidfd that cannot be opened (EMFILE) after the second fork: the two
    children forked are killed and reaped, the pidfd opened is closed, and the error reaches
    the caller."""
    real_pidfd_open, opened, pids = os.pidfd_open, [], []

    def pidfd_open_failing_second(pid, *args):
        pids.append(pid)
        if len(pids) == 2:
            raise OSError(24, "Too many open files (stand-in)")
        opened.append(real_pidfd_open(pid, *args))
        return opened[-1]

    monkeypatch.setattr(os, "pidfd_open", pidfd_open_failing_second)
    before = open_fds()

    def waits_for_its_kill():
        os.read(os.pipe()[0], 1)   # nobody writes: only the kill ends it
        os._exit(0)

    with pytest.raises(OSError, match="stand-in"):
        fork_thread.fork_all_from_clean_thread([waits_for_its_kill] * 3)
    assert len(pids) == 2   # the third child was never forked
    for pid in pids:   # reaped already: not our children any more
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
    assert open_fds() <= before   # the pidfd opened for the first child was closed
