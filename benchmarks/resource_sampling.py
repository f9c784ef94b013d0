"""What sampling each rank's resources costs the notebook (issue 34: at most 1% of one core, and
nothing per training step: the ranks do nothing for it).

Run: python benchmarks/resource_sampling.py [seconds]   (default 20 per row)

Starts real processes standing in for ranks (each imports torch and holds 200 MiB it wrote, so
``smaps_rollup`` has real page tables to walk), then calls the supervisor's sampling
(``oom.MemoryWatch.sample`` and ``ResourceSampler.publish``) as its loop does, every 0.1 s, for
the given time. The share is the CPU time of the notebook's thread inside those calls over the
wall time: a ratio, never a timed assertion. The 8-rank row after it reads smaps_rollup every
round (no budget), to show what the budget saves. The last row is a rank on another machine (Ray,
SLURM) sampling itself (``rank/reports/resources.py``): the same kind of process runs the rank's sampling
thread, sending on a pipe, and the share is that thread's CPU time in its samples and sends over
the wall time. Prints a markdown table; reports, never asserts.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from notebook_launch.record.logs import RunLogs  # noqa: E402
from notebook_launch.record.state import RankState, RunState  # noqa: E402
from notebook_launch.supervise import oom, resources  # noqa: E402

POLL = 0.1   # the supervisor's poll interval
RANK = ("import torch, sys, time\n"
        "block = bytearray(200 << 20); block[::4096] = b'\\1' * len(range(0, len(block), 4096))\n"
        "print('ready', flush=True); time.sleep(3600)")


def start_ranks(count: int) -> list[subprocess.Popen]:
    ranks = [subprocess.Popen([sys.executable, "-c", RANK], stdout=subprocess.PIPE, text=True) for _ in range(count)]
    for rank in ranks:
        assert rank.stdout is not None and rank.stdout.readline().strip() == "ready"
    return ranks


def share_of_a_core(pids: dict[int, int], seconds: float, log_dir: str) -> tuple[float, int]:
    """(CPU seconds in the sampling calls / wall seconds, rounds sampled)."""
    state = RunState("bench", len(pids), "fork", log_dir, [RankState(local, local) for local in pids])
    logs = RunLogs("bench", list(pids), list(pids), log_dir=log_dir)
    watch = oom.MemoryWatch((local, local) for local in pids)
    devices = {local: "cpu" for local in pids}
    spent = 0.0
    started = time.monotonic()
    try:
        while time.monotonic() - started < seconds:
            before = time.thread_time()
            watch.sample(pids, devices=devices)
            watch.resources.publish(state, logs)
            spent += time.thread_time() - before
            time.sleep(POLL)
    finally:
        logs.close()
    return spent / (time.monotonic() - started), watch.resources.rounds


SELF_SAMPLING = """
import os, sys, threading, time
sys.path.insert(0, {repo!r})
import torch
from notebook_launch.wire import protocol
from notebook_launch.rank.reports import resources
block = bytearray(200 << 20); block[::4096] = b'\\1' * len(range(0, len(block), 4096))
read_end, write_end = os.pipe()
def drain():
    while os.read(read_end, 1 << 16):
        pass
threading.Thread(target=drain, daemon=True).start()
writer = protocol.EventWriter(write_end)
protocol.install(writer)
spent = [0.0]
class Timed(resources.Reporter):
    def send_one(self):
        before = time.thread_time()
        try:
            return super().send_one()
        finally:
            spent[0] += time.thread_time() - before
reporter = Timed(writer, resources.SelfSampler("cpu"))
started = time.monotonic()
reporter.thread.start()
time.sleep({seconds})
reporter.stop(final=False)
print(spent[0] / (time.monotonic() - started), reporter.sent, reporter.sampler.cpu_spent / reporter.sampler.samples)
"""


def self_sampling(seconds: float) -> tuple[float, int, float]:
    """(the rank's sampling thread's CPU seconds / wall seconds, samples sent, CPU seconds a sample)."""
    repo = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    out = subprocess.run([sys.executable, "-c", SELF_SAMPLING.format(repo=repo, seconds=seconds)],
                         capture_output=True, text=True, check=True).stdout.split()
    return float(out[0]), int(out[1]), float(out[2])


def main() -> None:
    import tempfile
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 20.0
    rows = []
    for count in (2, 8):
        ranks = start_ranks(count)
        try:
            pids = {local: rank.pid for local, rank in enumerate(ranks)}
            with tempfile.TemporaryDirectory() as folder:
                share, rounds = share_of_a_core(pids, seconds, folder)
            rows.append((f"{count} ranks, the sampler as it runs", share, rounds))
            if count == 8:
                budget = resources.DETAIL_BUDGET
                resources.DETAIL_BUDGET = float("inf")   # every rank's smaps_rollup every round
                try:
                    with tempfile.TemporaryDirectory() as folder:
                        share, rounds = share_of_a_core(pids, seconds, folder)
                finally:
                    resources.DETAIL_BUDGET = budget
                rows.append((f"{count} ranks, smaps_rollup of every rank every round (no budget)", share, rounds))
        finally:
            for rank in ranks:
                rank.kill()
                rank.wait()
    share, sent, each = self_sampling(seconds)
    rows.append((f"a rank on another machine sampling itself ({each * 1000:.1f} ms a sample)", share, sent))
    print(f"{seconds:g} s per row, each rank a process that imported torch and holds 200 MiB, "
          f"Python {sys.version.split()[0]}, {os.cpu_count()} cores\n")
    print("| sampling | share of one core | rounds | goal (≤ 1%) |")
    print("| --- | ---: | ---: | --- |")
    for name, share, rounds in rows:
        goal = "—" if "no budget" in name else ("yes" if share <= 0.01 else "**NO**")
        print(f"| {name} | {share * 100:.2f}% | {rounds} | {goal} |")


if __name__ == "__main__":
    main()
