"""The parent closes each of its pipe fds exactly once.

In a Jupyter kernel other threads (zmq's I/O and subshell threads) open fds
at any time, and the OS hands them the lowest free numbers: the numbers of
pipes we just closed. Closing such a number a second time closes THEIR fd;
libzmq then aborts ("Bad file descriptor (src/signaler.cpp:157)") and the
notebook kernel dies -- seen after pressing Stop in JupyterLab under load.
Here a display opens "bystander" fds while the run ends, exactly where a
kernel thread could, and checks that they survive the launch.
"""
import os

import pytest

from notebook_launch import LaunchError, notebook_launcher
from notebook_launch.display.base import Display


class BystanderDisplay(Display):
    """Opens fds on the numbers the supervisor has just freed, like a zmq thread would."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.bystanders = []

    def close(self, state) -> None:
        for _ in range(12):
            self.bystanders.append(os.open(os.devnull, os.O_RDONLY))


def _still_open(fd) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


@pytest.fixture
def bystander_display():
    display = BystanderDisplay()
    yield display
    for fd in display.bystanders:
        if _still_open(fd):
            os.close(fd)


def _fails():
    raise ValueError("boom")


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_fds_opened_while_a_run_ends_survive_it(bystander_display, log_dir, start_method):
    assert notebook_launcher(lambda: 1, num_processes=2, start_method=start_method,
                             log_dir=log_dir, ui=bystander_display) == [1, 1]
    closed = [fd for fd in bystander_display.bystanders if not _still_open(fd)]
    assert not closed, f"the launcher closed fds it did not own (again): {closed}"


def test_fds_survive_a_failed_run(bystander_display, log_dir):
    with pytest.raises(LaunchError, match="boom"):
        notebook_launcher(_fails, num_processes=2, log_dir=log_dir, ui=bystander_display)
    closed = [fd for fd in bystander_display.bystanders if not _still_open(fd)]
    assert not closed, f"the launcher closed fds it did not own (again): {closed}"
