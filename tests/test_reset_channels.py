"""A rank on another machine (SLURM, Ray) reaches the notebook over TCP. When it is killed while
bytes of ours sit unread in its socket (the stop request we just sent it; SLURM's memory limit
or the OOM killer kills with SIGKILL), its kernel answers with a reset, and the notebook's next
read raises ECONNRESET instead of returning end-of-file. Every reader of a rank's channels takes
that as the end of the channel: the run goes on to its outcome instead of raising out of the
supervisor (CI saw exactly that: ConnectionResetError from ``Watcher.read_once``).

The ranks here are threads on loopback sockets; the reset is a real one (SO_LINGER 0).
"""
from __future__ import annotations

import errno
import os
import socket
import struct
import threading
import time
from typing import Any

import pytest

from notebook_launch import channels
from notebook_launch.wire import protocol
from notebook_launch.channels import read_ready
from notebook_launch.channels.sockets import SocketPipes, StreamListener, connect_streams
from notebook_launch.persistent.idle import IdleReader
from notebook_launch.supervise.watch import Watcher


class LoopbackRemoteRank(channels.RankProcess):
    """A rank "on another machine": a thread of this test whose end its sentinel pipe says."""

    on_this_machine = False

    def __init__(self, local_rank: int) -> None:
        self.local_rank = local_rank
        self.pid = 0
        self.ended_r, self._ended_w = os.pipe()
        self.sentinel = self.ended_r
        self.status: channels.WaitStatus | None = None

    def end(self) -> None:
        self.status = ("signal", 9)
        os.close(self._ended_w)

    def poll(self) -> channels.WaitStatus | None:
        return self.status


def reset(sock: socket.socket) -> None:
    """Close with a reset, as a killed process's kernel does for a socket holding unread bytes."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def remote_rank_that_prints_then_is_reset(address: tuple[str, int], token: bytes, said: threading.Event,
                                          go: threading.Event) -> None:
    socks = connect_streams(address[0], address[1], token, 0)
    protocol.EventWriter(socks[0].fileno()).send(protocol.READY, {"pid": 1, "device": "cpu"})
    socks[1].sendall(b"a line before the kill\n")
    said.set()
    go.wait(30)
    for sock in socks:
        reset(sock)


@pytest.fixture
def reset_rank():
    """One remote rank's four connections, accepted; ``go`` resets them all."""
    listener = StreamListener("127.0.0.1", world_size=1)
    said, go = threading.Event(), threading.Event()
    thread = threading.Thread(target=remote_rank_that_prints_then_is_reset,
                              args=(listener.address, listener.token, said, go))
    thread.start()
    pipes = listener.accept_all(time.monotonic() + 30, check=lambda: None)
    listener.close(keep=pipes)
    assert said.wait(30)
    try:
        yield pipes[0], go
    finally:
        go.set()
        thread.join(30)
        pipes[0].close_parent_ends()


def reset_after_our_stop_request(pipes: SocketPipes, go: threading.Event) -> None:
    """Send the stop request (unread by the rank: that is what makes its close a reset), then reset."""
    assert pipes.send_signal(15)
    time.sleep(0.2)   # let the frame reach the rank's receive buffer
    go.set()


class Recorder:
    def __init__(self) -> None:
        self.events: list[Any] = []
        self.lines: list[str] = []
        self.exits: list[channels.RankProcess] = []

    def on_event(self, watch, kind, payload) -> None:
        self.events.append(kind)

    def on_line(self, local_rank, stream, text) -> None:
        self.lines.append(text)

    def on_process_exit(self, process) -> None:
        self.exits.append(process)


def test_a_reset_connection_reads_as_end_of_file(reset_rank):
    pipes, go = reset_rank
    os.set_blocking(pipes.stderr_r, False)
    assert read_ready(pipes.stderr_r, 4096) is None   # nothing yet: not the end
    reset_after_our_stop_request(pipes, go)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:   # the raw read shows what the kernel says: a reset, not end-of-file
            os.read(pipes.events_r, 1 << 16)
        except ConnectionResetError:
            break
    else:
        pytest.fail("the events socket never said it was reset")
    assert read_ready(pipes.stdout_r, 1 << 16) == b"a line before the kill\n"
    assert read_ready(pipes.stdout_r, 1 << 16) == b""


def test_the_supervisors_watcher_ends_a_reset_rank_channels_and_keeps_its_output(reset_rank):
    pipes, go = reset_rank
    process = LoopbackRemoteRank(0)
    recorder = Recorder()
    watcher = Watcher([process], [pipes], recorder)
    try:
        reset_after_our_stop_request(pipes, go)
        process.end()
        watch = watcher.watches[0]
        deadline = time.monotonic() + 30
        while (watch.open_fds or not recorder.exits) and time.monotonic() < deadline:
            watcher.pump(0.1)
        assert not watch.open_fds, "every channel of the reset rank ends"
        assert recorder.exits == [process]
        assert recorder.events == [protocol.READY]
        assert recorder.lines == ["a line before the kill"]
    finally:
        watcher.close()
        os.close(process.ended_r)


def test_the_reader_between_persistent_calls_ends_a_reset_rank_channels(reset_rank, tmp_path, caplog):
    """Persistent ranks on SLURM or Ray are read by ``IdleReader`` between calls: a reset there
    ends the channel, rather than failing every batch its thread handles from then on (the
    reset socket stays readable, so the thread would spin on it)."""
    from notebook_launch.record.logs import RunLogs

    pipes, go = reset_rank
    process = LoopbackRemoteRank(0)
    logs = RunLogs("run", [0], [0], log_dir=str(tmp_path))
    exits: list[channels.RankProcess] = []
    caplog.set_level("DEBUG", logger="notebook_launch")
    reader = IdleReader([process], [pipes], logs, tag=lambda local: f"[rank {local}] ",
                        events={0: protocol.EventReader()}, on_exit=exits.append, show=lambda: False)
    try:
        reset_after_our_stop_request(pipes, go)
        time.sleep(0.3)   # the reader meets the reset before it hears of the exit
        process.end()
        deadline = time.monotonic() + 30
        while not exits and time.monotonic() < deadline:
            time.sleep(0.05)
        assert exits == [process]
    finally:
        reader.stop()
        os.close(process.ended_r)
        logs.close()
    failures = [r for r in caplog.records if "reader of the ranks failed" in r.getMessage()]
    assert not failures, f"{len(failures)} failed batches, the first: {failures[0].exc_info}"
    assert "a line before the kill" in (tmp_path / "rank0.log").read_text()


def test_an_error_that_is_not_a_gone_peer_still_raises():
    """Only the errors that mean the rank's end went away read as end-of-file; a bad fd is a
    defect of ours and must not be hidden."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    os.close(write_end)
    with pytest.raises(OSError) as raised:
        read_ready(read_end, 16)
    assert raised.value.errno == errno.EBADF
