"""What a forked rank's cheaper start (issue 45) must keep exactly: its environment, as both
Python and the C library see it (set from pairs encoded in the notebook before the fork), and a
plain scalar result (pickled by ``pickle`` itself, not the result pickler), each value and its
exact type, beside values that still take the result pickler (subclasses, a long str)."""
from __future__ import annotations

import ctypes
import enum
import fcntl
import math
import os
import subprocess

import numpy as np

from notebook_launch import notebook_launcher
from notebook_launch.planning.net import free_port
from notebook_launch.rank import runner

NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS")


def environment_seen_three_ways() -> dict:
    """Each variable as ``os.environ``, the C library's ``getenv`` and a child process see it."""
    libc = ctypes.CDLL(None)
    libc.getenv.restype = ctypes.c_char_p
    child = subprocess.run(["env"], capture_output=True, text=True, check=True).stdout.splitlines()
    in_child = dict(line.split("=", 1) for line in child if "=" in line)
    return {name: (os.environ.get(name), (libc.getenv(name.encode()) or b"").decode() or None, in_child.get(name))
            for name in NAMES}


def test_a_ranks_environment_is_the_same_to_python_c_and_its_children():
    results = notebook_launcher(environment_seen_three_ways, num_processes=2, use_port=free_port())
    for rank, seen in enumerate(results):
        for name, (python, c, child) in seen.items():
            assert python is not None and python == c == child, (rank, name, python, c, child)
        assert seen["RANK"][0] == str(rank) and seen["WORLD_SIZE"][0] == "2", seen


class Colour(enum.IntEnum):
    """An int subclass: pickled by reference, through the result pickler."""
    RED = 1


LONG = "x" * (runner.SHORT + 10)
VALUES = (None, True, False, 0, -7, 2 ** 100, 1.5, -0.0, math.inf, 3 + 4j, "", "grüße ✓", b"\x00\xff",
          "y" * (runner.SHORT - 1), LONG, Colour.RED, np.float64(2.5), np.int64(9))


def every_plain_value() -> tuple:
    return VALUES


def nan() -> float:
    return math.nan


def test_plain_scalars_come_back_as_they_were_with_their_exact_types():
    (result,) = notebook_launcher(every_plain_value, num_processes=1, use_port=free_port())
    assert len(result) == len(VALUES)
    for got, sent in zip(result, VALUES):
        assert type(got) is type(sent) and got == sent, (got, sent)
        if isinstance(sent, float):
            assert math.copysign(1, got) == math.copysign(1, sent)


def test_each_plain_scalar_alone_is_the_whole_result():
    """A scalar as the whole result is the path that skips the result pickler."""
    for value in (None, True, 2 ** 100, -0.0, 3 + 4j, "grüße ✓", b"\x00\xff", LONG, Colour.RED, np.float64(2.5)):
        (got,) = notebook_launcher(lambda value=value: value, num_processes=1, use_port=free_port())
        assert type(got) is type(value) and got == value, (got, value)
    (got,) = notebook_launcher(nan, num_processes=1, use_port=free_port())
    assert type(got) is float and math.isnan(got)


def pipes_held() -> list:
    """(pipe inode, "r" or "w") of each pipe end this process holds."""
    held = []
    for name in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{name}")
            flags = fcntl.fcntl(int(name), fcntl.F_GETFL)
        except OSError:
            continue   # the listing's own fd, closed by now
        if link.startswith("pipe:"):
            held.append((link, "w" if flags & os.O_ACCMODE == os.O_WRONLY else "r"))
    return held


def test_a_rank_keeps_no_other_ranks_pipes_nor_its_own_notebook_ends():
    """The fds a rank closes at its start are listed in the notebook before its forks (issue 45):
    no pipe made for the launch is held by two ranks, and a rank holds one end of each of its own
    (the where-thread's wake pipe, made in the rank, is the one it holds both ends of)."""
    before = {link for link, _ in pipes_held()}
    results = notebook_launcher(pipes_held, num_processes=3, use_port=free_port())
    owners: dict = {}
    for rank, held in enumerate(results):
        ends: dict = {}
        for link, end in held:
            if link in before:
                continue   # the notebook's own, inherited as any fork inherits them
            owners.setdefault(link, set()).add(rank)
            ends.setdefault(link, set()).add(end)
        both = [link for link, seen in ends.items() if seen == {"r", "w"}]
        assert len(both) <= 1, (rank, held)
    shared = {link: ranks for link, ranks in owners.items() if len(ranks) > 1}
    assert not shared, shared
