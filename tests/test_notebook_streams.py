"""A notebook whose standard streams are not working files still launches, and the ranks' output
goes to their logs (issue 32 item 2).

Each of ``sys.stdout``, ``sys.stderr`` and ``sys.stdin`` in each state a real notebook gets into:
None (``pythonw``, some services), a closed file, an object without ``fileno`` (a library's
or a harness's replacement), one whose ``fileno`` raises (``io.StringIO``), one whose writes
fail (a terminal that went away: EIO); and fds 0, 1 and 2 themselves closed (a daemonized
host). Fork launches for every stream in every state; spawn launches and persistent ranks with
all three streams in each state at once. Every rank's stdout and stderr, Python's and C-level,
is in its log; what the notebook side shows goes to a stream that works, and is dropped where
none does. Before the fix a None or closed stdout or stderr, or one whose writes fail, failed
the launch with the notebook's own AttributeError/ValueError/OSError.
"""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Callable

import pytest

from notebook_launch import notebook_launcher, start_ranks
from notebook_launch.planning.net import free_port

MARKS = ("OUT-LINE", "ERR-LINE", "FD1-LINE", "FD2-LINE")


def talk() -> int:
    """Every kind of output a rank makes: Python's print to stdout and stderr, C-level writes to
    fds 1 and 2."""
    rank = os.environ["RANK"]
    print("OUT-LINE of rank", rank)
    print("ERR-LINE of rank", rank, file=sys.stderr)
    os.write(1, f"FD1-LINE of rank {rank}\n".encode())
    os.write(2, f"FD2-LINE of rank {rank}\n".encode())
    return int(rank)


class NoFileno:
    """A stream a library made: write and flush, nothing else. Keeps what was written."""

    def __init__(self) -> None:
        self.text = ""

    def write(self, text: str) -> int:
        self.text += text
        return len(text)

    def flush(self) -> None:
        pass

    def read(self, size: int = -1) -> str:
        return ""

    def readline(self, size: int = -1) -> str:
        return ""


class WritesFail:
    """A terminal that went away: every write and flush raises EIO, fileno says it is closed."""

    def write(self, text: str) -> int:
        raise OSError(5, "Input/output error")

    def flush(self) -> None:
        raise OSError(5, "Input/output error")

    def fileno(self) -> int:
        raise ValueError("I/O operation on closed file")

    def readline(self, size: int = -1) -> str:
        raise OSError(5, "Input/output error")


def _closed(name: str) -> io.TextIOWrapper:
    stream = open(os.devnull, "r" if name == "stdin" else "w")
    stream.close()
    return stream


STATES: dict[str, Callable[[str], Any]] = {
    "None": lambda name: None,
    "a closed file": _closed,
    "no fileno": lambda name: NoFileno(),
    "fileno raises": lambda name: io.StringIO(),
    "writes fail": lambda name: WritesFail(),
}
STREAMS = ("stdout", "stderr", "stdin")


def rank_logs(log_dir: Path) -> dict[str, str]:
    return {path.name: path.read_text() for path in sorted(log_dir.rglob("rank*.log"))}


def assert_output_in_logs(log_dir: Path, ranks: int = 2) -> None:
    logs = rank_logs(log_dir)
    assert sorted(logs) == [f"rank{r}.log" for r in range(ranks)], logs
    for name, text in logs.items():
        rank = name.removeprefix("rank").removesuffix(".log")
        for mark in MARKS:
            assert f"{mark} of rank {rank}" in text, (name, text)


@pytest.mark.parametrize("state", list(STATES))
@pytest.mark.parametrize("stream", STREAMS)
def test_a_fork_launch_from_a_notebook_with_an_odd_stream(stream, state, tmp_path, monkeypatch):
    odd = STATES[state](stream)
    monkeypatch.setattr(sys, stream, odd)
    results = notebook_launcher(talk, num_processes=2, start_method="fork", use_port=str(free_port()),
                                log_dir=str(tmp_path / "logs"), ui="text", timeout=240)
    assert results == [0, 1]
    assert_output_in_logs(tmp_path / "logs")
    if isinstance(odd, NoFileno) and stream == "stdout":   # a stream that works still shows the launch
        assert "notebook_launch: 2 ranks" in odd.text and "OUT-LINE of rank 1" in odd.text, odd.text


@pytest.mark.parametrize("state", list(STATES))
def test_a_spawn_launch_from_a_notebook_with_every_stream_odd(state, tmp_path, monkeypatch):
    for stream in STREAMS:
        monkeypatch.setattr(sys, stream, STATES[state](stream))
    results = notebook_launcher(talk, num_processes=2, start_method="spawn", use_port=str(free_port()),
                                log_dir=str(tmp_path / "logs"), ui="text", timeout=240)
    assert results == [0, 1]
    assert_output_in_logs(tmp_path / "logs")


@pytest.mark.parametrize("state", list(STATES))
def test_persistent_ranks_from_a_notebook_with_every_stream_odd(state, tmp_path, monkeypatch):
    for stream in STREAMS:
        monkeypatch.setattr(sys, stream, STATES[state](stream))
    with start_ranks(2, use_port=free_port(), log_dir=str(tmp_path / "logs"), ui="text", timeout=240) as ranks:
        assert ranks.run(talk) == [0, 1]
        assert ranks.run(talk) == [0, 1]   # a second call, after output between calls
    assert_output_in_logs(tmp_path / "logs")


CLOSED_FDS_NOTEBOOK = textwrap.dedent('''
    import json, os, sys
    sys.path.insert(0, {tests!r})
    from test_notebook_streams import talk
    from notebook_launch import notebook_launcher, start_ranks
    from notebook_launch.planning.net import free_port
    report = open({report!r}, "w")   # opened first: it is none of fds 0-2
    for fd in (0, 1, 2):
        os.close(fd)
    results = {{}}
    for method in ("fork", "spawn"):
        results[method] = notebook_launcher(talk, num_processes=2, start_method=method, use_port=str(free_port()),
                                            log_dir=os.path.join({logs!r}, method), ui="text", timeout=240)
    with start_ranks(2, use_port=free_port(), log_dir=os.path.join({logs!r}, "persistent"), ui="text",
                     timeout=240) as ranks:
        results["persistent"] = ranks.run(talk)
    json.dump(results, report)
''')


def test_ranks_of_a_notebook_whose_fds_0_1_2_are_closed(tmp_path):
    """A daemonized host: the notebook's fds 0, 1 and 2 closed (sys.std* then fail with EBADF)."""
    tests = os.path.dirname(os.path.abspath(__file__))
    report, logs = tmp_path / "report.json", tmp_path / "logs"
    code = CLOSED_FDS_NOTEBOOK.format(tests=tests, report=str(report), logs=str(logs))
    done = subprocess.run([sys.executable, "-c", code], stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert json.loads(report.read_text()) == {"fork": [0, 1], "spawn": [0, 1], "persistent": [0, 1]}
    for method in ("fork", "spawn", "persistent"):
        assert_output_in_logs(logs / method)


def test_in_a_real_kernel_with_every_stream_odd_ranks_launch_and_log(tmp_path):
    """In a Jupyter kernel whose cell set sys.stdout to None, closed sys.stderr and replaced
    sys.stdin with an object without fileno: fork and spawn launches and persistent ranks run, and
    every rank's output is in its log; the kernel's streams come back for the last cell."""
    from helpers.nbutil import cell_text, make_notebook, run_notebook
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    out, logs = tmp_path / "results.json", tmp_path / "logs"
    nb = make_notebook(textwrap.dedent(f'''
        import io, json, os, sys
        sys.path.insert(0, {tests_dir!r})
        from test_notebook_streams import talk
        from notebook_launch import notebook_launcher, start_ranks
        from notebook_launch.planning.net import free_port
        kernel_streams = sys.stdout, sys.stderr, sys.stdin
        closed = open(os.devnull, "w")
        closed.close()
        sys.stdout, sys.stderr, sys.stdin = None, closed, io.StringIO()
        results = {{}}
        try:
            for method in ("fork", "spawn"):
                results[method] = notebook_launcher(talk, num_processes=2, start_method=method,
                                                    use_port=str(free_port()), timeout=240,
                                                    log_dir=os.path.join({str(logs)!r}, method))
            with start_ranks(2, use_port=free_port(), timeout=240,
                             log_dir=os.path.join({str(logs)!r}, "persistent")) as ranks:
                results["persistent"] = ranks.run(talk)
        finally:
            sys.stdout, sys.stderr, sys.stdin = kernel_streams
        json.dump(results, open({str(out)!r}, "w"))
    '''), 'print("the kernel prints again")')
    executed = run_notebook(nb, cwd=str(tmp_path), timeout=600)
    assert json.loads(out.read_text()) == {"fork": [0, 1], "spawn": [0, 1], "persistent": [0, 1]}
    for method in ("fork", "spawn", "persistent"):
        assert_output_in_logs(logs / method)
    assert "the kernel prints again" in cell_text(executed.cells[1])
