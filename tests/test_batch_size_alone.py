"""find_executable_batch_size when a call runs without some ranks (issue 44): the ranks still end
at one batch size where they can, and the rest is defined.

A call closes when a rank finishes an attempt before every rank of the group joined it (a
function with no collective, a rank that ran out of memory before its first collective): no rank
ever waits for a peer that has not called. Each rank then goes on alone, but never above the
call's lowest size (the smallest any rank of it ended at or backed off to): a rank calling later
starts there, and a rank whose attempt fit at a larger size runs again at it. A rank that calls
later and runs out of memory below where the others already returned ends smaller: the others
cannot be called back (the module docstring of ``rank.batch.batch_size`` says so).

Real launches with gloo; an allocation fails for real (``bytearray`` of 2**62 bytes raises
``MemoryError``) above the size a rank fits. Who calls when is ordered with files, not timing."""
from __future__ import annotations

import os
import time

import pytest

from notebook_launch import find_executable_batch_size, notebook_launcher
from notebook_launch.planning.net import free_port

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

TIMEOUT = 60   # seconds: far above what a launch takes


def launch(function, log_dir: str, args: tuple, ranks: int):
    return notebook_launcher(function, args=args, num_processes=ranks, log_dir=log_dir, ui="text",
                             use_port=str(free_port()), start_method="fork", timeout=TIMEOUT)


def allocate(batch_size: int, fits: int) -> None:
    bytearray(2**62 if batch_size > fits else 16)


def signal(folder: str, name: str) -> None:
    with open(os.path.join(folder, name), "w"):
        pass


def wait_for(folder: str, name: str) -> None:
    path = os.path.join(folder, name)
    while not os.path.exists(path):
        time.sleep(0.02)


def one_rank_late(folder: str) -> list:
    """Every rank calls a function with no collective; rank 1 only once rank 0 returned."""
    dist.init_process_group("gloo")
    rank = dist.get_rank()

    @find_executable_batch_size(starting_batch_size=128)
    def step(batch_size: int) -> int:
        allocate(batch_size, 100 if rank == 0 else 1000)
        return batch_size

    if rank == 1:
        wait_for(folder, "rank 0 returned")
    size = step()
    if rank == 0:
        signal(folder, "rank 0 returned")
    again = step()   # a second call, every rank at once: one size, no "different starting sizes"
    dist.barrier()   # rank 0 holds the store: it stays until every rank is done with it
    return [size, again]


def test_a_rank_calling_after_the_call_closed_starts_at_the_size_its_peer_ended_at(log_dir, tmp_path):
    """128 -> 115 -> 103 -> 92 on rank 0; rank 1 (which fits 128) starts at 92, not at 128."""
    assert launch(one_rank_late, log_dir, (str(tmp_path),), 2) == [[92, 92], [92, 92]]


def three_ranks_some_joined(folder: str, late_fits: int) -> int:
    """Rank 1 is in its first attempt (at 128) when rank 0 runs out of memory before any collective;
    rank 2 calls only once rank 1 returned."""
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    fits = {0: 100, 1: 1000, 2: late_fits}[rank]

    @find_executable_batch_size(starting_batch_size=128)
    def step(batch_size: int) -> int:
        if rank == 1 and batch_size == 128:
            signal(folder, "rank 1 in its attempt")
            wait_for(folder, "rank 0 returned")
        allocate(batch_size, fits)
        return batch_size

    if rank == 0:
        wait_for(folder, "rank 1 in its attempt")
    if rank == 2:
        wait_for(folder, "rank 1 returned")
    size = step()
    signal(folder, f"rank {rank} returned")
    dist.barrier()   # rank 0 holds the store: it stays until every rank is done with it
    return size


def test_three_ranks_some_joined_when_one_ran_out_of_memory_end_at_one_size(log_dir, tmp_path):
    """Rank 0 closes the call and backs off alone to 92; rank 1's attempt fit at 128 but runs again
    at 92; rank 2, calling later, starts at 92."""
    assert launch(three_ranks_some_joined, log_dir, (str(tmp_path), 1000), 3) == [92, 92, 92]


def test_a_late_rank_that_runs_out_of_memory_below_the_others_ends_smaller(log_dir, tmp_path):
    """The defined exception: rank 2 calls after the others returned at 92 and fits only 50: it
    backs off alone from 92 (82, 73, 65, 58, 52, 46); the others cannot be called back."""
    assert launch(three_ranks_some_joined, log_dir, (str(tmp_path), 50), 3) == [92, 92, 46]
