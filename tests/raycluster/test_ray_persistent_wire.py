"""The channel of persistent Ray (and SLURM) ranks without a cluster: what ``engines.remote.persistent`` writes
on a rank's events connection is what ``engines.remote.serve`` reads (a real socket pair, the same
functions as on a cluster; only Ray's placement is missing, which tests/raycluster's cluster
tests cover)."""
from __future__ import annotations

import os
import socket
import threading

import torch

from notebook_launch.channels import commands, remote_commands
from notebook_launch.persistent import command_frames
from notebook_launch.engines.remote.persistent import MessageSlot, call_message, write_whole
from notebook_launch.rank.serve import Call
from notebook_launch.engines.remote import serve as ray_serve
from notebook_launch.rank.runner import Job


def scale(t, by):
    return t * by


def test_a_call_with_big_tensors_and_an_interrupt_cross_whole():
    notebook_end, rank_end = socket.socketpair()
    os.set_blocking(notebook_end.fileno(), False)   # as the notebook's reader keeps it
    finished = threading.Event()
    inbox = ray_serve.listen(rank_end, finished)
    big = torch.arange(3_000_000, dtype=torch.float32)   # 12 MB: more than the socket buffers
    frame = command_frames.encode(commands.Command.CALL, Call(Job(scale, (big, 2.0)), number=7))
    try:
        assert frame.tensors is not None   # the tensor went to the frame's file, not the pickle
        with call_message(frame) as parts:
            write_whole(notebook_end.fileno(), parts)
    finally:
        frame.close()
    slot = MessageSlot(lambda message: write_whole(notebook_end.fileno(), [message]))
    slot.request(7)

    received = inbox.calls.get(timeout=30)
    assert received is not None
    kind, call = ray_serve.decode(*received)
    assert kind == "call" and call.number == 7
    assert torch.equal(call.job.function(*call.job.args), big * 2)
    deadline = threading.Event()
    for _ in range(100):                         # the interrupt comes after the call, on the same stream
        if inbox.slot.requested(7):
            break
        deadline.wait(0.05)
    assert inbox.slot.requested(7)
    assert not slot.serving(0)                   # the notebook never signals a Ray rank's pid itself

    finished.set()                               # (a rank whose notebook goes away mid-call exits)
    notebook_end.close()
    assert inbox.calls.get(timeout=30) is None   # end of file reads as STOP
    rank_end.close()


def test_stop_ends_the_loop():
    notebook_end, rank_end = socket.socketpair()
    finished = threading.Event()
    inbox = ray_serve.listen(rank_end, finished)
    write_whole(notebook_end.fileno(), [remote_commands.encode_message(remote_commands.Kind.STOP)])
    assert inbox.calls.get(timeout=30) is None
    assert inbox.stopped.is_set()
    notebook_end.close()   # after STOP, the end of the connection is no reason to exit
    rank_end.close()
