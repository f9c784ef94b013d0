"""Where Ray ranks are when a run hangs (issue 20): each rank's actor answers the notebook's where
request on its own connections (``rank.reports.remote_where`` / ``diagnose.remote_where``), so a timeout's
LaunchError names where every rank is, as a local run's does.

The first tests need no cluster: a real answering thread on real sockets, in this process, with a
thread blocked in ``time.sleep`` and a collective record. The last one runs a real two-node Ray
cluster (conftest.py) with a notebook in a real kernel."""
from __future__ import annotations

import json
import re
import socket
import threading
import time

import pytest

from notebook_launch.diagnose.remote_where import WhereAsker, decode_answer
from notebook_launch.channels.sockets import SIGNAL_FRAME, SocketPipes
from notebook_launch.channels import remote_where
from notebook_launch.rank.reports import remote_where as rank_where, whereabouts

pytestmark = pytest.mark.timeout(600)


def test_request_frames_are_not_signals_and_start_with_a_zero_byte():
    for number in (0, 1, 77, remote_where.REQUEST_BASE + 3):
        frame = remote_where.request_frame(number)
        assert len(frame) == SIGNAL_FRAME.size and frame[0] == 0   # ray_serve tells it from a message by it
        assert remote_where.request_number(SIGNAL_FRAME.unpack(frame)[0]) == number % remote_where.REQUEST_BASE
    for signum in (2, 9, 15, 64):
        assert remote_where.request_number(signum) is None


def from_another_thread(fn):
    """``fn()`` run by a thread of its own (as a rank's answering thread runs), its value."""
    out = []
    thread = threading.Thread(target=lambda: out.append(fn()))
    thread.start()
    thread.join()
    return out[0]


def test_a_reply_round_trips_with_its_collective_stacks_and_sources(monkeypatch):
    record = whereabouts.Record()
    record.announce()
    text = whereabouts.FIELD_SEP.join(("all_reduce", "default group", "(4,) float32", __file__, "7", "train"))
    record.enter("key", 3, lambda: text)
    monkeypatch.setattr(whereabouts, "_record", record)
    data = from_another_thread(lambda: remote_where.encode_reply(5, rank_where.snapshot()))
    magic, number, size = remote_where.REPLY.unpack_from(data)
    assert (magic, number, size) == (remote_where.REPLY_MAGIC, 5, len(data) - remote_where.REPLY.size)
    where = decode_answer(data[remote_where.REPLY.size:], rank=4)
    assert where.rank == 4 and where.note == ""
    assert where.inside is not None and (where.inside.op, where.inside.seq, where.inside.tensors) == \
        ("all_reduce", 3, "(4,) float32")
    assert where.inside.caller is not None and where.inside.caller.lineno == 7
    assert where.main_thread == threading.main_thread().ident
    main = where.main_frames()   # the asking thread leaves itself out; the main thread waits for it here
    assert main and all(thread.frames[0].function != "snapshot" for thread in where.threads)
    assert any(frame.function == "test_a_reply_round_trips_with_its_collective_stacks_and_sources" for frame in main)
    record.leave()
    where = decode_answer(remote_where.encode_reply(6, rank_where.snapshot())[remote_where.REPLY.size:], rank=4)
    assert where.inside is None and where.last is not None and where.last.op == "all_reduce"


def sleeping_here(stop: threading.Event) -> None:
    while not stop.is_set():
        time.sleep(0.05)   # blocked in C, as a rank in gloo or time.sleep


class FakeRayRankWithoutRay:
    """A RayRank's two connections without Ray (a socketpair each): what WhereAsker uses."""

    def __init__(self, local_rank: int) -> None:
        self.local_rank = local_rank
        self.events_here, self.events_there = socket.socketpair()
        self.answers_here, self.answers_there = socket.socketpair()
        self.pipes = SocketPipes(events_r=self.events_here.fileno(), events_w=-1, stdout_r=-1, stdout_w=-1,
                                 stderr_r=-1, stderr_w=-1, answers_r=-1, answers_w=self.answers_here.fileno())

    def poll(self) -> None:
        return None


def serve_requests(rank: FakeRayRankWithoutRay, answerer: rank_where.Answerer | None) -> None:
    """The actor's control thread (``rank.reports.remote_where.obey_notebook``'s request handling); ``answerer``
    None: a rank that never answers (a lost node)."""
    while True:
        data = rank.events_there.recv(SIGNAL_FRAME.size)
        if not data:
            return
        number = remote_where.request_number(SIGNAL_FRAME.unpack(data)[0])
        if answerer is not None and number is not None:
            answerer.ask(number)


def test_the_asker_asks_every_rank_at_once_and_a_silent_one_is_named():
    stop = threading.Event()
    sleeper = threading.Thread(target=sleeping_here, args=(stop,), daemon=True)
    sleeper.start()
    ranks = [FakeRayRankWithoutRay(0), FakeRayRankWithoutRay(1), FakeRayRankWithoutRay(2)]
    answerers = [rank_where.Answerer(ranks[0].answers_there), rank_where.Answerer(ranks[1].answers_there), None]
    for rank, answerer in zip(ranks, answerers):
        threading.Thread(target=serve_requests, args=(rank, answerer), daemon=True).start()
    asker = WhereAsker(ranks, wait=3.0)
    try:
        first = asker.ask(ranks[0], lambda local: local + 10)
        second = asker.ask(ranks[1], lambda local: local + 10)
        third = asker.ask(ranks[2], lambda local: local + 10)
        assert asker.number == 1   # one round answered all three
        where = first[0]
        assert where.rank == 10 and where.note == "had not started the launched function yet"   # no record here
        # the sleeping thread is seen inside time.sleep (a C call: its innermost Python frame is the caller)
        sleeping = [t for t in where.threads if t.frames and t.frames[0].function == "sleeping_here"]
        assert len(sleeping) == 1 and sleeping[0].frames[0].filename == __file__
        assert second[1].rank == 11 and second[1].threads
        assert third[2].rank == 12 and third[2].note.startswith("did not say where it is within 3 s")
        again = asker.ask(ranks[0], lambda local: local + 10)   # asked again: a new round
        assert asker.number == 2 and again[0].threads
        assert asker.ask(ranks[2], lambda local: local + 10)[2].note.startswith("did not say")   # round 2's
        # rank 2's answer to round 2 comes late, after round 2 gave up on it: not taken for round 3's
        ranks[2].answers_there.sendall(remote_where.encode_reply(2, {"error": "late"}))
        answer = threading.Timer(0.3, lambda: ranks[2].answers_there.sendall(
            remote_where.encode_reply(3, rank_where.snapshot())))
        answer.start()
        late = asker.ask(ranks[2], lambda local: local + 10)
        answer.join()
        assert asker.number == 3 and late[2].threads and not late[2].note.startswith("could not")
    finally:
        stop.set()
        for rank in ranks:
            for sock in (rank.events_here, rank.events_there, rank.answers_here, rank.answers_there):
                sock.close()


def test_a_persistent_rank_between_calls_says_it_waits_for_the_next_call():
    reply = remote_where.encode_reply(1, rank_where.snapshot(between_calls=True))
    where = decode_answer(reply[remote_where.REPLY.size:], 0)
    assert where.note == "waits for the next call"
    assert all(thread.ident != where.main_thread for thread in where.threads)


# --- on the real two-node cluster -------------------------------------------------------------------
SETUP = """
import json, os, time
from notebook_launch import notebook_launcher, RayCluster, LaunchError
HEAD = {head!r}
"""


@pytest.fixture(scope="module")
def notebook(ray_nodes):
    ray_nodes.notebook.value(SETUP.format(head=ray_nodes.head) + "\nprint(json.dumps(True))")
    return ray_nodes.notebook


def test_a_timeout_says_where_each_ray_rank_is(ray_nodes, notebook):
    """Rank 1 (on the other node) sleeps instead of joining the all_reduce rank 0 waits in: the timeout's first line
    says so, naming the cells' lines, though neither rank's process is on the notebook's machine."""
    out = notebook.run("""
import torch, torch.distributed as dist
def joined():
    dist.init_process_group("gloo")
    dist.barrier()
def train():
    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        time.sleep(600)
    dist.all_reduce(torch.ones(4))
# How long ranks take to start, import torch and join here now: on a loaded machine (the lanes'
# kernels beside the cluster) a rank was still importing torch when a fixed 40 s ran out.
started = time.monotonic()
notebook_launcher(joined, num_processes=2, cluster=RayCluster(address=HEAD, placement="SPREAD"), ui="none")
allowed = max(40, round(3 * (time.monotonic() - started)))
try:
    notebook_launcher(train, num_processes=2, cluster=RayCluster(address=HEAD, placement="SPREAD"),
                      timeout=allowed, ui="none")
except LaunchError as err:
    print(json.dumps({"message": str(err)}))
""", timeout=540)
    assert out["error"] is None, out
    message = json.loads(out["stdout"].strip().splitlines()[-1])["message"]
    first = message.splitlines()[0]
    assert re.search(r"rank 0 waits in all_reduce #1 \(Cell In\[\d+\], line \d+\); rank 1 never reached it: "
                     r"it is in train\(\) at Cell In\[\d+\], line \d+ \(time\.sleep\(600\)\)", first), message
    assert "was not asked" not in message
    assert "time.sleep(600)" in message and "dist.all_reduce(torch.ones(4))" in message   # the detail's lines


def test_a_persistent_rank_reads_a_where_request_between_its_messages():
    """``engines.remote.serve``'s reader takes the 4-byte request between its 17-byte messages: both are
    read whole, the request is answered on the answers connection, the next message still counts."""
    from notebook_launch.channels import remote_commands
    from notebook_launch.engines.remote import serve as ray_serve
    notebook_end, rank_end = socket.socketpair()
    answers_notebook, answers_rank = socket.socketpair()
    finished = threading.Event()
    inbox = ray_serve.listen(rank_end, finished, answers_rank)
    try:
        interrupt = remote_commands.encode_message(remote_commands.Kind.INTERRUPT, 4)
        notebook_end.sendall(interrupt + remote_where.request_frame(9)
                             + remote_commands.encode_message(remote_commands.Kind.STOP))
        assert inbox.calls.get(timeout=30) is None   # STOP, read after the request
        assert inbox.stopped.is_set() and inbox.slot.requested(4)
        answers_notebook.settimeout(30)
        data = b""
        header = remote_where.REPLY.size
        while len(data) < header or len(data) < header + remote_where.REPLY.unpack_from(data)[2]:
            data += answers_notebook.recv(1 << 16)
        assert remote_where.REPLY.unpack_from(data)[:2] == (remote_where.REPLY_MAGIC, 9)
        assert decode_answer(data[remote_where.REPLY.size:], 0).threads
    finally:
        finished.set()
        for sock in (notebook_end, rank_end, answers_notebook, answers_rank):
            sock.close()


def test_a_timed_out_call_of_persistent_ray_ranks_says_where_each_rank_is(ray_nodes, notebook):
    """The same hang in a call of persistent Ray ranks (their events connection carries messages):
    the call's timeout names where each rank is."""
    out = notebook.run("""
from notebook_launch import start_ranks
ranks = start_ranks(2, cluster=RayCluster(address=HEAD, placement="SPREAD"), ui="none")
def join():   # untimed: on a loaded machine importing torch alone once took a call's whole 30 s
    import torch.distributed as dist
    dist.init_process_group("gloo")
def hang():
    import torch, torch.distributed as dist
    if dist.get_rank() == 1:
        time.sleep(600)
    dist.all_reduce(torch.ones(4))
try:
    ranks.run(join)
    ranks.run(hang, timeout=30)
except LaunchError as err:
    print(json.dumps({"message": str(err)}))
finally:
    ranks.close()
""", timeout=400)
    assert out["error"] is None, out
    message = json.loads(out["stdout"].strip().splitlines()[-1])["message"]
    assert re.search(r"rank 0 waits in all_reduce #1 \(Cell In\[\d+\], line \d+\); rank 1 never reached it: "
                     r"it is in hang\(\) at Cell In\[\d+\], line \d+ \(time\.sleep\(600\)\)",
                     message.splitlines()[0]), message
    assert "was not asked" not in message
