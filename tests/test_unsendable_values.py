"""An open file, pipe or socket never crosses to or from a rank (issue 23 item 15).

The README promises that something that cannot be pickled (a lock, an open file) is refused
before any rank starts, naming the argument. cloudpickle sent a read-mode text file as a
StringIO of its contents (empty once read to the end), so a spawned rank got a different
object than the notebook passed. Tested for the class of descriptor-holding objects (text and
binary, read/write/both, raw, a pipe, a socket and its file, temporary files, a closed file),
as a spawned rank's argument (refused before any rank starts, the path inside the argument
named), as a rank's result (fork, spawn; the path inside the result named), and as a
persistent rank's ``push``/``run`` argument and ``run`` result. In-memory streams and the
process's own stdout/stderr still travel (the latter by name: the other side's own stream).
"""
from __future__ import annotations

import dataclasses
import io
import os
import socket
import sys
import tempfile

import pytest

from notebook_launch import LaunchArgumentError, LaunchError, notebook_launcher, start_ranks
from notebook_launch.wire import pickling
from notebook_launch.planning.net import free_port
from helpers.processes import children


def descriptor_holders(tmp_path):
    """name -> a factory of one object of each kind that holds a descriptor of this process."""
    path = tmp_path / "data.txt"
    path.write_text("hello\n")

    def pipe_reader():
        r, w = os.pipe()
        os.close(w)
        return os.fdopen(r, "rb")

    def socket_file():
        a, b = socket.socketpair()
        b.close()
        f = a.makefile("rb")
        a.close()
        return f

    def closed_file():
        f = open(path)
        f.close()
        return f

    return {
        "text read": lambda: open(path),
        "text read at its end": lambda: _read_to_end(open(path)),
        "text write": lambda: open(tmp_path / "out.txt", "w"),
        "text read-write": lambda: open(path, "r+"),
        "binary read": lambda: open(path, "rb"),
        "binary write": lambda: open(tmp_path / "out.bin", "wb"),
        "binary read-write": lambda: open(path, "rb+"),
        "raw": lambda: open(path, "rb", buffering=0),
        "pipe": pipe_reader,
        "socket": lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM),
        "socket file": socket_file,
        "TemporaryFile": lambda: tempfile.TemporaryFile(dir=tmp_path),
        "NamedTemporaryFile": lambda: tempfile.NamedTemporaryFile(dir=tmp_path),
        "closed file": closed_file,
    }


def _read_to_end(f):
    f.read()
    return f


KINDS = ["text read", "text read at its end", "text write", "text read-write", "binary read", "binary write",
         "binary read-write", "raw", "pipe", "socket", "socket file", "TemporaryFile", "NamedTemporaryFile",
         "closed file"]


@dataclasses.dataclass
class Config:
    name: str
    sink: object


def takes(*args, **kwargs):
    return "ran"


@pytest.mark.parametrize("kind", KINDS)
def test_spawn_refuses_an_open_file_argument_before_any_rank_starts(kind, tmp_path):
    holder = descriptor_holders(tmp_path)[kind]()
    try:
        with pytest.raises(LaunchArgumentError) as caught:
            notebook_launcher(takes, args=({"cfg": Config("x", holder)},), num_processes=2, start_method="spawn",
                              use_port=str(free_port()), log_dir=str(tmp_path / "logs"), ui="text")
        message = str(caught.value)
        assert "args[0]['cfg'].sink" in message, message
        assert "file" in message or "socket" in message, message
        assert children() == []
    finally:
        holder.close()


def test_a_kwarg_is_named_too(tmp_path):
    with open(tmp_path / "x", "w") as f:
        with pytest.raises(LaunchArgumentError, match=r"kwargs\['log'\]\[1\] \(_io.TextIOWrapper\)"):
            notebook_launcher(takes, kwargs={"log": [0, f]}, num_processes=1, start_method="spawn",
                              use_port=str(free_port()), log_dir=str(tmp_path / "logs"), ui="text")


def test_in_memory_streams_and_the_standard_streams_still_travel(tmp_path):
    from notebook_launch.wire import shared_tensors
    value = [io.BytesIO(b"bytes"), io.StringIO("text"), sys.stdout, sys.stderr]
    back = shared_tensors.loads(shared_tensors.dumps(value, None), None)
    assert back[0].getvalue() == b"bytes" and back[1].getvalue() == "text"
    assert back[2] is sys.stdout and back[3] is sys.stderr   # by name: the receiving side's own
    for kind, factory in descriptor_holders(tmp_path).items():
        holder = factory()
        try:
            with pytest.raises(pickling.UnsendableValueError, match="file|socket"):
                shared_tensors.dumps({"x": holder}, None)
                pytest.fail(f"{kind} was pickled")
        finally:
            holder.close()


def returns_an_open_file():
    import torch
    return {"weights": torch.zeros(3), "log": [open(os.devnull)]}


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_a_result_holding_an_open_file_is_refused_naming_its_path(start_method, tmp_path):
    with pytest.raises(LaunchError) as caught:
        notebook_launcher(returns_an_open_file, num_processes=1, start_method=start_method,
                          use_port=str(free_port()), log_dir=str(tmp_path / "logs"), ui="text", timeout=240)
    message = str(caught.value)
    assert "result['log'][0] (_io.TextIOWrapper)" in message, message
    assert "that cannot be pickled: result" in message and "open file" in message, message


def test_persistent_ranks_refuse_open_files_both_ways(tmp_path):
    with open(tmp_path / "data.txt", "w+") as f, \
            start_ranks(2, use_port=free_port(), log_dir=str(tmp_path / "logs"), ui="text", timeout=120) as ranks:
        with pytest.raises(Exception, match="open file") as pushed:
            ranks.push(f=f)
        assert "StringIO" not in str(pushed.value)
        with pytest.raises(Exception, match="open file"):
            ranks.run(takes, args=(f,))
        with pytest.raises(LaunchError, match=r"result\['log'\]\[0\]"):
            ranks.run(returns_an_open_file)
        assert ranks.run(takes) == ["ran", "ran"]   # the ranks are fine afterwards


def test_a_ranks_cell_names_an_open_file_among_the_values_it_cannot_send(tmp_path):
    """%%ranks checks the notebook values a cell names as they would be sent: an open file is
    named (with why), not passed as an empty copy and refused for the whole cell."""
    import io

    from notebook_launch.rank.namespace import unpicklable
    path = tmp_path / "data.txt"
    path.write_text("x")
    with open(path) as handle:
        unsent = unpicklable({"handle": handle, "buffer": io.StringIO("kept"), "n": 3})
    assert list(unsent) == ["handle"]
    assert "an open file" in unsent["handle"] and "cannot be sent" in unsent["handle"]
