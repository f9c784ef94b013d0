"""What processes a rank forks send on the rank's event pipe (issue 32, item 4).

- Bars: a DataLoader worker (forked, with the rank's channel) that draws bars (tqdm, progress())
  must not mix them into the rank's: the rank's row shows its own loader bar, exact, to the end.
- Frames: a frame over PIPE_BUF written by a forked child and frames written by the rank at the
  same time must arrive whole, each of them (a write over PIPE_BUF to a full pipe goes in pieces).
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers.panel_helpers import KeepStateDisplay

from notebook_launch import load_metrics, notebook_launcher

torch = pytest.importorskip("torch")
data = pytest.importorskip("torch.utils.data")


class ItemsWithBars:
    """A map-style dataset: each item is made under bars of the worker's own (tqdm and
    progress(), 10 steps each)."""

    def __len__(self) -> int:
        return 6

    def __getitem__(self, index: int):
        from tqdm import tqdm

        from notebook_launch import progress
        total = 0
        for step in tqdm(range(10), desc=f"item{index}"):
            total += step
        for step in progress(range(10), desc=f"p-item{index}"):
            total += step
        return torch.tensor([index, total])


def loads_with_workers_that_draw_bars(library: str):
    """The rank's own loader bar (progress() or tqdm) over a loader whose workers draw bars."""
    from tqdm import tqdm

    from notebook_launch import progress
    loader = data.DataLoader(ItemsWithBars(), batch_size=2, num_workers=2)
    bar = progress if library == "progress" else tqdm
    seen = []
    for batch in bar(loader, desc="loader"):
        seen.extend(batch[:, 0].tolist())
    return sorted(seen)


@pytest.mark.parametrize("library", ["progress", "tqdm"])
def test_a_dataloader_workers_bars_never_mix_into_the_ranks_row(library):
    pytest.importorskip("tqdm")
    display = KeepStateDisplay()
    assert notebook_launcher(loads_with_workers_that_draw_bars, (library,),
                             num_processes=2, ui=display) == [list(range(6))] * 2
    for rs in display.state.ranks:
        bars = [(bar.desc, bar.n, bar.total, bar.closed) for bar in rs.bars.values()]
        assert bars == [("loader", 3, 3, True)], bars
        main = rs.main_bar
        assert main is not None and (main.desc, main.n, main.total) == ("loader", 3, 3)


# --- frames over PIPE_BUF from a child and the rank at once ---------------------------------------

def sends_large_frames_with_a_forked_child(rounds: int):
    """The rank forks a child; both log 600 metrics and send them at once, ``rounds`` times each
    (a frame of ~20 KB: over PIPE_BUF), while the rank also sends small frames in between."""
    import importlib
    progress = importlib.import_module("notebook_launch.rank.reports.progress")
    pid = os.fork()
    who = "child" if pid == 0 else "rank"
    try:
        for round_ in range(rounds):
            progress.log(**{f"{who}{i}": float(round_) for i in range(600)})
            progress.flush()
            if who == "rank":
                progress.log(small=round_)
                progress.flush()
    finally:
        if pid == 0:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_large_frames_of_a_forked_child_and_of_the_rank_arrive_whole():
    rounds = 100
    display = KeepStateDisplay()
    assert notebook_launcher(sends_large_frames_with_a_forked_child, (rounds,), num_processes=1, ui=display) == [0]
    rs = display.state.ranks[0]
    assert rs.metrics["child599"] == rs.metrics["rank599"] == float(rounds - 1)
    assert rs.metrics["small"] == rounds - 1
    logged = load_metrics(pandas=False)   # every value every frame carried, in metrics.jsonl
    for name in ("child0", "child599", "rank0", "rank599", "small"):
        values = [v for metric, v in zip(logged["metric"], logged["value"]) if metric == name]
        assert values == list(range(rounds)), (name, values)


STRESS = r"""
import os, sys, threading, time
import notebook_launch.wire.protocol as channel

read_end, write_end = os.pipe()
writer = channel.EventWriter(write_end)          # the rank's channel, as a rank has it
big = b"x" * 100_000                             # well over PIPE_BUF, and over the pipe's 64 KB
chunks = []

def read_slowly():                               # a busy notebook: the pipe is full most of the time
    while True:
        chunk = os.read(read_end, 7000)
        if not chunk:
            return
        chunks.append(chunk)
        time.sleep(0.0005)

reader = threading.Thread(target=read_slowly)
reader.start()
pid = os.fork()
if pid == 0:
    for n in range(40):
        writer.send(channel.PROGRESS, {"who": "child", "n": n, "blob": big})
    os._exit(0)
for n in range(400):
    writer.send(channel.PROGRESS, {"who": "rank", "n": n, "blob": big if n % 10 == 0 else b""})
os.waitpid(pid, 0)
os.close(write_end)
if getattr(writer, "_frame_lock", None) is not None:   # a description of the write end, too
    os.close(writer._frame_lock[1])
reader.join()
got = {"child": [], "rank": []}
decoder = channel.EventReader()
try:
    for kind, payload in decoder.feed(b"".join(chunks)):
        assert payload["blob"] in (big, b""), "a frame arrived with another's bytes in it"
        got[payload["who"]].append(payload["n"])
    assert not decoder._buffer, f"{len(decoder._buffer)} bytes left that make no whole frame"
except Exception as exc:
    print("CORRUPT", type(exc).__name__, str(exc)[:200])
    sys.exit(0)
print("CHILD", got["child"] == list(range(40)), "RANK", got["rank"] == list(range(400)))
"""


def test_frames_over_pipe_buf_from_a_child_and_the_rank_never_interleave():
    """The event channel itself, with a slow reader so that the pipe is full and large writes go
    in pieces: every frame of the child (100 KB each) and of the rank (large and small) arrives
    whole and in order."""
    done = subprocess.run([sys.executable, "-c", STRESS], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.stdout.strip() == "CHILD True RANK True", done.stdout + done.stderr


def test_a_channel_that_cannot_be_opened_again_sends_unlocked():
    """A rank whose events go over a socket (a Ray actor's) has no description of its own to lock:
    its frames go as before, and it does not try again on every send."""
    import socket

    import notebook_launch.wire.protocol as channel
    ours, theirs = socket.socketpair()
    with ours, theirs:
        writer = channel.EventWriter(ours.fileno())
        for n in range(3):
            writer.send(channel.PROGRESS, {"n": n})
        assert writer._frame_lock == (os.getpid(), -1)
        theirs.settimeout(60)
        received = b""
        events: list = []
        decoder = channel.EventReader()
        while len(events) < 3:
            received = theirs.recv(65536)
            events.extend(decoder.feed(received))
        assert [payload["n"] for _, payload in events] == [0, 1, 2]
