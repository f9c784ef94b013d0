"""A DataLoader worker that deadlocks (issue 20): the timeout's error names the rank that waits
for its batch, with that rank's stack inside the DataLoader (``_next_data`` / ``_get_data``),
and the worker process itself with where it is stuck. Real gloo ranks, a real DataLoader with
one worker process.

The deadlock is the classic one: a lock held by the rank when the DataLoader forks its worker
(here taken by the rank's own code; in the wild a logging handler's lock or a C library's) stays
held in the worker for ever, so its ``__getitem__`` never returns; the rank waits for the batch
while the other rank waits for it in the next all_reduce.
"""
from __future__ import annotations

import inspect
import os
import threading

import pytest

from notebook_launch import LaunchError, notebook_launcher
from notebook_launch.planning.net import free_port

pytest.importorskip("torch")
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.utils import data  # noqa: E402

HERE = os.path.basename(__file__)
TIMEOUT = 30   # seconds: both ranks have reached their hanging lines long before (gloo's start, one fork)


def line_of(function, text: str) -> int:
    lines, first = inspect.getsourcelines(function)
    for offset, line in enumerate(lines):
        if text in line:
            return first + offset
    raise AssertionError(f"{text!r} not in {function.__qualname__}")


class Guarded(data.Dataset):
    """Every item is read under a lock, as a dataset sharing a reader between threads does."""

    def __init__(self) -> None:
        self.lock = threading.Lock()

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int):
        with self.lock:
            return torch.full((2,), float(index))


def train_with_a_deadlocking_worker():
    dist.init_process_group("gloo")
    dataset = Guarded()
    if dist.get_rank() == 1:
        dataset.lock.acquire()   # held when the worker forks: in the worker it is never released
    batches = iter(data.DataLoader(dataset, batch_size=2, num_workers=1))
    total = torch.zeros(2)
    for _ in range(2):
        batch = next(batches)
        dist.all_reduce(batch)
        total += batch.sum(0)
    return total


def test_a_deadlocked_dataloader_worker_is_named_with_the_rank_waiting_for_it(log_dir):
    with pytest.raises(LaunchError) as info:
        notebook_launcher(train_with_a_deadlocking_worker, num_processes=2, timeout=TIMEOUT, log_dir=log_dir,
                          ui="text", use_port=str(free_port()))
    error = info.value
    assert error.kind == "timeout"
    text = str(error)
    reduce_line = line_of(train_with_a_deadlocking_worker, "dist.all_reduce(batch)")
    next_line = line_of(train_with_a_deadlocking_worker, "batch = next(batches)")
    assert text.splitlines()[0] == (
        f"notebook_launch: timed out after {TIMEOUT} s: rank 0 waits in all_reduce #1 ({HERE}:{reduce_line}); "
        f"rank 1 never reached it: it is in train_with_a_deadlocking_worker() at {HERE}:{next_line} "
        f"(batch = next(batches))"), text
    rank1 = text[text.index("rank 1:"):]
    # the rank's own stack, inside the DataLoader, waiting for the worker's batch
    assert "_next_data() at dataloader.py:" in rank1 and "_get_data() at dataloader.py:" in rank1
    # and the worker: which process, and the line it is stuck on
    getitem = line_of(Guarded.__getitem__, "with self.lock:")
    worker = [line.strip() for line in rank1.splitlines() if "its DataLoader worker, process" in line]
    assert len(worker) == 1, rank1
    assert worker[0].endswith(f"is in __getitem__() at {HERE}:{getitem} (with self.lock:):"), worker[0]
    assert "_worker_loop() at worker.py:" in rank1
