"""progress() and tqdm inside real launched ranks (fork, real processes)."""
import importlib
import itertools
import os
from typing import cast

import pytest

from helpers.panel_helpers import KeepStateDisplay

from notebook_launch import notebook_launcher, progress

# The package attribute `progress` is the public alias of Progress; its module is notebook_launch.rank.reports.progress
progress_module = importlib.import_module("notebook_launch.rank.reports.progress")


def test_outside_a_launch_progress_is_a_plain_pass_through():
    data = [1, 2, 3]
    bar = progress(data, desc="x")
    assert type(iter(bar)) is type(iter(data))   # no wrapper generator at all
    assert list(bar) == data
    bar.update(5, loss=1.0)
    progress.log(loss=2.0)
    assert bar.n == 0 and len(bar) == 3


def _fast_loop(n):
    import importlib
    import time
    started = time.monotonic()
    for i in progress(range(n), desc="train"):
        if i % 50_000 == 0:
            progress.log(loss=1.0 / (i + 1), step=i)
    manual = progress(total=1000, desc="manual", unit="batch")
    for _ in range(1000):
        manual.update(1, lr=0.01)
    manual.close()
    elapsed = time.monotonic() - started
    module = importlib.import_module("notebook_launch.rank.reports.progress")
    rep = module.reporter()
    module.flush()
    return {"sends": rep.sends, "elapsed": elapsed}


def test_bars_reach_the_parent_exactly_and_events_are_batched():
    n = 600_000
    display = KeepStateDisplay()
    results = notebook_launcher(_fast_loop, args=(n,), num_processes=2, ui=display)
    state = display.state
    for rs, result in zip(state.ranks, results):
        bars = {bar.desc: bar for bar in rs.bars.values()}
        assert bars["train"].n == n and bars["train"].total == n and bars["train"].closed
        assert bars["manual"].n == 1000 and bars["manual"].unit == "batch"
        assert rs.metrics["step"] == 550_000 and rs.metrics["lr"] == 0.01
        # at most ~10 PROGRESS events a second whatever the step rate (+ the final flushes)
        assert result["sends"] <= result["elapsed"] * progress_module.MAX_SENDS_PER_SECOND + 3
        assert rs.updates <= result["sends"] + 1


def _tqdm_loops():
    import sys
    from tqdm import tqdm as std_tqdm
    from tqdm.auto import tqdm as auto_tqdm
    from tqdm.notebook import tqdm as notebook_tqdm
    for _ in std_tqdm(range(3000), desc="std"):
        pass
    with auto_tqdm(total=40, desc="auto") as bar:
        for _ in range(40):
            bar.update(1)
            bar.set_postfix(loss=0.25)
    for _ in notebook_tqdm(range(77), desc="nb"):
        pass
    for _ in std_tqdm(range(5), desc="tty-only", disable=None):   # would be off on a non-terminal
        pass
    for _ in std_tqdm(range(5), desc="off", disable=True):
        pass
    print("tqdm done", file=sys.stderr)
    return True


def test_tqdm_bars_become_panel_bars_without_garbled_output():
    pytest.importorskip("tqdm")
    display = KeepStateDisplay()
    assert notebook_launcher(_tqdm_loops, num_processes=2, ui=display) == [True, True]
    for rs in display.state.ranks:
        bars = {bar.desc: bar for bar in rs.bars.values()}
        assert (bars["std"].n, bars["std"].total) == (3000, 3000)
        assert (bars["auto"].n, bars["nb"].n, bars["tty-only"].n) == (40, 77, 5)
        assert "off" not in bars
        assert all(bar.closed for bar in bars.values())
        assert rs.metrics["loss"] == 0.25
    texts = [text for _, _, text in display.lines]
    assert texts.count("tqdm done") == 2
    assert not [t for t in texts if "it/s" in t or "%|" in t], texts   # tqdm wrote nothing


def _nested(epochs):
    for _ in progress(range(epochs), desc="epoch"):
        for _ in progress(range(100), desc="batch"):
            pass
    return True


def test_nested_bars_final_state():
    display = KeepStateDisplay()
    notebook_launcher(_nested, args=(5,), num_processes=2, ui=display)
    for rs in display.state.ranks:
        main = rs.main_bar
        assert main is not None and (main.desc, main.n, main.total) == ("epoch", 5, 5)
        assert [b.n for b in rs.bars.values() if b.desc == "batch"] == [100] * 5


def _one_batch_of_both_orders():
    """Two bar stories reach the notebook in one PROGRESS event, where only each bar's latest
    fields survive: 'epoch' (touched first) has 'inner' open and close inside it, then closes;
    'first' closes before 'second' opens. The flusher is held off (its send lock) so the batch
    cannot split, which would hide the order it loses."""
    import importlib
    module = importlib.import_module("notebook_launch.rank.reports.progress")
    module.flush()
    rep = module.reporter()
    with rep.send_lock:
        epoch = progress(total=2, desc="epoch")
        epoch.update(1)
        epoch._check()                       # publish now: 'epoch' is the batch's first entry
        inner = progress(total=1, desc="inner")
        inner.update(1)
        inner.close()
        epoch.update(1)
        epoch.close()
        first = progress(total=1, desc="first")
        first.close()
        second = progress(total=1, desc="second")
        second.close()
    module.flush()
    return rep.sends


def test_nesting_is_known_when_one_batch_holds_a_bars_close_and_anothers_open():
    """In one batch 'epoch' closes after 'inner' opened inside it: the rank, which saw the
    order, says so (the notebook once applied the close first and counted no nesting, so
    Lightning's row ended on the sanity check in a loaded CI run); a bar opened after another
    closed is not nested in it."""
    display = KeepStateDisplay()
    notebook_launcher(_one_batch_of_both_orders, num_processes=1, ui=display)
    bars = {bar.desc: bar for bar in display.state.ranks[0].bars.values()}
    assert set(bars) == {"epoch", "inner", "first", "second"} and all(b.closed for b in bars.values())
    assert (bars["epoch"].nested, bars["inner"].nested) == (1, 0)
    assert (bars["first"].nested, bars["second"].nested) == (0, 0)
    main = display.state.ranks[0].main_bar
    assert main is not None and main.desc == "epoch"


def test_progress_iteration_keeps_counting_past_checks():
    # The hot loop only compares with a threshold; a rank-less bar must still count when it has a
    # reporter. Simulate one with a recording writer (no parent process involved).
    import notebook_launch.wire.protocol as channel

    class Writer:
        events = []

        def send(self, kind, payload):
            self.events.append((kind, payload))

    writer = Writer()
    channel.install(cast(channel.EventWriter, writer))   # duck-typed: progress only calls send()
    try:
        bar = progress(itertools.islice(itertools.count(), 100_000), desc="t", total=100_000)
        assert sum(1 for _ in bar) == 100_000
        progress_module.flush()
        last = {}
        for kind, payload in writer.events:
            assert kind == channel.PROGRESS
            for fields in payload["bars"].values():
                last.update(fields)
        assert last["n"] == 100_000 and last["closed"] is True
    finally:
        channel.install(None)


FORK_WHILE_LOCKED = """
import os, signal, sys
from helpers.forking import hold_in_another_thread
import notebook_launch.wire.protocol as channel
progress_module = __import__("notebook_launch.rank.reports.progress", fromlist=["reporter"])

read_end, write_end = os.pipe()
writer = channel.EventWriter(write_end)   # the rank's channel, as a rank has it
channel.install(writer)
hold_in_another_thread({"reporter": progress_module._reporter_lock, "writer": writer._lock}[sys.argv[1]])
pid = os.fork()
if pid == 0:
    signal.alarm(10)   # the old way: waits for a lock no thread of this process will release
    progress_module.log(loss=0.5)
    progress_module.flush()
    os._exit(0)
_, status = os.waitpid(pid, 0)
print("CHILD", os.waitstatus_to_exitcode(status))
os.set_blocking(read_end, False)
events = channel.EventReader().feed(os.read(read_end, 65536))
print("SENT", [(kind.value, payload.get("metrics")) for kind, payload in events])
"""


@pytest.mark.parametrize("lock", ["reporter", "writer"])
def test_a_process_forked_while_a_thread_holds_a_progress_lock_reports_all_the_same(lock):
    """A rank's DataLoader worker forked while another thread of the rank held the lock that
    guards making the reporter, or the rank's channel's send lock (a tqdm monitor thread sending):
    the worker's progress.log() is sent, where it waited forever for a lock no thread of its own
    would release."""
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-c", FORK_WHILE_LOCKED, lock], capture_output=True, text=True,
                          timeout=60, cwd=os.path.dirname(os.path.abspath(__file__)))   # for helpers.forking
    assert "CHILD 0" in done.stdout, done.stdout + done.stderr
    assert "SENT [('progress', {'loss': 0.5})]" in done.stdout, done.stdout + done.stderr
