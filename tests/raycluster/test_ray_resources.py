"""Ray ranks report their own resources (issue 34 item 1): the notebook cannot read an actor's /proc
(its pid is its node's), so each actor samples itself (``rank/reports/resources.py``, started by
``engines.ray.actor``) and sends RESOURCES events; the rows, the final picture and the rank logs show
them as a local rank's. A real two-node Ray cluster (conftest.py), the notebook a real kernel on
node A, ranks on both nodes. Every wait is for a condition."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(600)

MiB = 1 << 20
ALLOCATED = 200 * MiB

CELL = """
import json, os, time
from notebook_launch import notebook_launcher, RayCluster
from notebook_launch.rank.reports import resources
def train():
    reporter = resources.current()
    assert reporter is not None, "a Ray rank samples itself"
    block = bytearray({allocated}); block[::4096] = b"\\1" * len(range(0, len(block), 4096))
    sent = reporter.sent
    deadline = time.monotonic() + 120
    while reporter.sent < sent + 2 and time.monotonic() < deadline:   # a whole sample with the block went out
        time.sleep(0.05)
    return {{"pid": os.getpid(), "sent": reporter.sent - sent}}
results = notebook_launcher(train, num_processes=4, ui="text",
                            cluster=RayCluster(address={head!r}, placement="SPREAD"))
print(json.dumps(results))
"""
PEAK = re.compile(r"^\s*rank (\d)\b.*\[avg cpu \d+% · peak ([\d.]+) (MiB|GiB) own of ([\d.]+) (MiB|GiB) resident",
                  re.MULTILINE)


def mib(amount: str, unit: str) -> float:
    return float(amount) * (1024 if unit == "GiB" else 1)


def test_ray_ranks_on_both_nodes_show_their_own_memory_and_cpu(ray_nodes):
    out = ray_nodes.notebook.run(CELL.format(allocated=ALLOCATED, head=ray_nodes.head))
    assert out["error"] is None, out
    results = json.loads(out["stdout"].strip().splitlines()[-1])
    assert [r["sent"] >= 2 for r in results] == [True] * 4, results
    # the final picture: every rank, on either node, its average CPU and its peak own memory
    peaks = {int(rank): mib(own, unit) for rank, own, unit, _, _ in PEAK.findall(out["stdout"])}
    assert sorted(peaks) == [0, 1, 2, 3], out["stdout"][-3000:]
    assert all(peak >= ALLOCATED / MiB for peak in peaks.values()), peaks
    # each rank's log has the whole of it: USS, PSS, resident
    log_dir = Path(re.search(r"logs: (\S+)", out["stdout"]).group(1))   # type: ignore[union-attr]
    for rank in range(4):
        text = (log_dir / f"rank{rank}.log").read_text()
        assert "[notebook_launch] resources: " in text and "(USS)" in text and "(PSS)" in text, text


PERSISTENT = """
from notebook_launch import start_ranks
from notebook_launch.display import choose_display
from notebook_launch.display.base import Display
own = {{}}   # global rank -> the most own memory (USS) a call's rows showed of it
class Keeping(Display):   # the text display, and what its rows show of each rank's own memory
    def __init__(self):
        super().__init__()
        self.shown = choose_display("text")
        self.name = self.shown.name
    def keep(self, state):
        for rs in state.ranks:
            if rs.resources is not None:
                own[rs.rank] = max(own.get(rs.rank, 0), rs.resources.uss or 0)
    def tag(self, state, local_rank):
        return self.shown.tag(state, local_rank)
    def start(self, state):
        self.shown.start(state)
    def line(self, state, local_rank, stream, text):
        self.shown.line(state, local_rank, stream, text)
    def refresh(self, state):
        self.shown.refresh(state)
        self.keep(state)
    def prompting(self, state, showing):
        self.shown.prompting(state, showing)
    def close(self, state):
        self.keep(state)
        self.shown.close(state)
ranks = start_ranks(2, cluster=RayCluster(address={head!r}, placement="SPREAD"), ui=Keeping())
def hold():
    global block   # kept for the next call: the ranks' memory is theirs between calls
    reporter = resources.current()
    block = bytearray({allocated}); block[::4096] = b"\\1" * len(range(0, len(block), 4096))
    sent = reporter.sent
    deadline = time.monotonic() + 120
    while reporter.sent < sent + 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    return reporter.sent - sent
try:
    sent = ranks.run(hold)
finally:
    ranks.close()
print(json.dumps({{"sent": sent, "own": own}}))
"""


def test_persistent_ray_ranks_show_their_own_memory_in_a_call(ray_nodes):
    """A persistent Ray rank samples itself for the actor's life; a call's rows show it (the text
    display prints no final picture per call: the call's run state is watched instead)."""
    out = ray_nodes.notebook.run(CELL.split("def train", 1)[0]
                                 + PERSISTENT.format(allocated=ALLOCATED, head=ray_nodes.head))
    assert out["error"] is None, out
    found = json.loads(out["stdout"].strip().splitlines()[-1])
    assert [sent >= 2 for sent in found["sent"]] == [True, True], out
    assert sorted(found["own"]) == ["0", "1"], found   # ranks on both nodes
    assert all(own >= ALLOCATED for own in found["own"].values()), found
