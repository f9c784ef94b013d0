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


def environment_after_changes() -> dict:
    """What the rank's environment reads after the rank changes it: a variable changed, one
    added, one removed, each through ``os.environ`` (the C library's setenv and unsetenv on the
    environment the rank was given), as Python, ``os.environb``, ``getenv`` and a shell see them."""
    libc = ctypes.CDLL(None)
    libc.getenv.restype = ctypes.c_char_p
    os.environ["RANK"] = "changed-" + os.environ["RANK"]
    os.environ["NL_TEST_ADDED"] = "added"
    del os.environ["NL_TEST_REMOVED"]
    shell = subprocess.run(["sh", "-c", 'echo "$RANK|$NL_TEST_ADDED|${NL_TEST_REMOVED-unset}|$NL_TEST_C_ONLY"'],
                           capture_output=True, text=True, check=True).stdout.strip()
    status = os.system('test "$NL_TEST_ADDED" = added && test -z "${NL_TEST_REMOVED+x}"')
    c = [(libc.getenv(name) or b"unset").decode() for name in (b"RANK", b"NL_TEST_ADDED", b"NL_TEST_REMOVED",
                                                                  b"NL_TEST_C_ONLY")]
    return {"python": [os.environ["RANK"], os.environ.get("NL_TEST_ADDED"), os.environ.get("NL_TEST_REMOVED", "unset")],
            "environb": [os.environb[b"RANK"].decode(), os.environb.get(b"NL_TEST_ADDED", b"").decode(),
                         os.environb.get(b"NL_TEST_REMOVED", b"unset").decode()],
            "getenv_py": os.getenv("WORLD_SIZE"), "c": c, "shell": shell, "system": status,
            "c_only_in_python": os.environ.get("NL_TEST_C_ONLY")}


def test_a_rank_changes_its_environment_as_any_process_does():
    """The rank's environment is built whole in the notebook and the rank points the C library's
    ``environ`` and ``os.environ`` at it (issue 45): changing it afterwards, a child process and
    ``os.environb`` behave as they would after ``putenv``. A variable the notebook set for the C
    library alone (``os.putenv``) is in the rank's C environment and not in its ``os.environ``,
    as before; and the notebook's own environment is left as it was."""
    os.environ["NL_TEST_REMOVED"] = "here"
    os.putenv("NL_TEST_C_ONLY", "c-only")
    before = dict(os.environ)
    try:
        results = notebook_launcher(environment_after_changes, num_processes=2, use_port=free_port())
    finally:
        del os.environ["NL_TEST_REMOVED"]
        os.unsetenv("NL_TEST_C_ONLY")
    for rank, seen in enumerate(results):
        expected = [f"changed-{rank}", "added", "unset"]
        assert seen["python"] == expected and seen["environb"] == expected, (rank, seen)
        assert seen["c"] == expected + ["c-only"], (rank, seen)
        assert seen["shell"] == "|".join(expected + ["c-only"]) and seen["system"] == 0, (rank, seen)
        assert seen["getenv_py"] == "2" and seen["c_only_in_python"] is None, (rank, seen)
    assert dict(os.environ, NL_TEST_REMOVED="here") == before and "RANK" not in os.environ


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


def pipes_of_the_launch() -> tuple[list, list]:
    """(pipe ends this rank holds, the pipes the launch made for this rank): its output (fds 1
    and 2), its event pipe and the pipe its prompts' answers come on, as links."""
    from notebook_launch.wire import protocol
    writer = protocol.current()
    assert writer is not None, "a launched rank has its event writer"
    own = [os.readlink(f"/proc/self/fd/{fd}") for fd in (1, 2, writer.fd, writer.answers_fd)]
    return pipes_held(), own


def test_a_rank_keeps_no_other_ranks_pipes_nor_its_own_notebook_ends():
    """The fds a rank closes at its start are listed in the notebook before its forks (issue 45):
    of the pipes the launch made for a rank, that rank holds only its own end, and no other rank
    holds either end. Judged on those pipes alone (each rank names its own): a pipe some other
    thread of the notebook made while the ranks forked is any fork's to inherit, not the launch's."""
    results = notebook_launcher(pipes_of_the_launch, num_processes=3, use_port=free_port())
    for rank, (_, own) in enumerate(results):
        assert len(own) == 4 and all(link.startswith("pipe:") for link in own), (rank, own)
        for other, (held, _) in enumerate(results):
            ends = {end for link, end in held if link in own}
            if other == rank:   # one end of each: the notebook's ends were closed in the rank
                assert all({end for link, end in held if link == mine} in ({"r"}, {"w"}) for mine in own), \
                    (rank, own, held)
            else:
                assert not ends, (other, "holds", rank, own, held)
