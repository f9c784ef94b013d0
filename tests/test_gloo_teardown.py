"""``destroy_process_group(); return`` with a live DDP model must never hang a rank.

torch 2.13 can deadlock there (see notebook_launch/rank/group/process_groups.py). Without the fix the
loop below hangs in nearly every run: each round is one more chance (a few % each, more under
load), and it runs ~100 rounds. A hang shows as the launch timeout; nothing here is timed.
"""
import os
import sys
import time
from datetime import timedelta

import pytest

torch = pytest.importorskip("torch")

from notebook_launch import notebook_launcher  # noqa: E402

ROUNDS_FOR = 15.0        # seconds of rounds (rank 0 decides, so both ranks run the same count)
MAX_ROUNDS = 100


def _groups_kept_by_the_rank():
    """How many process groups the rank holds on to (rank/group/process_groups.py's own references;
    the groups themselves cannot tell: a DDP model sits in a reference cycle, so it and its
    group outlive ``del model`` until the garbage collector runs)."""
    from notebook_launch.rank.group import process_groups
    return len(process_groups._kept)


def _ddp_destroy_free_rounds():
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from notebook_launch.rank.group import process_groups

    sys.setswitchinterval(5.0)   # the main thread keeps the GIL unless it blocks: as under load
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # One store for all rounds (PrefixStore per round): no re-binding of a port between rounds.
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          rank == 0, timeout=timedelta(seconds=60))
    started = time.monotonic()
    rounds = 0
    kept_after_destroy = []
    while True:
        dist.init_process_group("gloo", store=dist.PrefixStore(f"round{rounds}", store),
                                rank=rank, world_size=world)
        model = DDP(torch.nn.Linear(3, 1))
        for _ in range(2):
            model(torch.randn(4, 3)).sum().backward()
        dist.destroy_process_group()
        kept_after_destroy.append(_groups_kept_by_the_rank() > 0)
        del model                # frees DDP's Reducer: where plain torch 2.13 can deadlock
        if rounds % 2:           # let go right away too (as before a re-init): the Python
            process_groups.release_destroyed_groups()   # owner frees the group without the GIL
        rounds += 1
        if rank == 0:
            more = rounds < MAX_ROUNDS and time.monotonic() - started < ROUNDS_FOR
            store.set(f"more{rounds}", "1" if more else "0")
        else:
            more = store.get(f"more{rounds}") == b"1"
        if not more:
            break
    # Rank 0's store (its process) must outlive the others' last request. A TCPStore set() gets no
    # reply, so a rank that ends on set() never reads from a store that is gone; rank 0 waits until
    # every other rank's set arrived (after their last get()), then may end.
    if rank == 0:
        store.wait([f"done{r}" for r in range(1, world)])
    else:
        store.set(f"done{rank}", "1")
    return {"rounds": rounds, "kept": all(kept_after_destroy)}


def test_freeing_ddp_after_destroy_process_group_never_hangs():
    results = notebook_launcher(_ddp_destroy_free_rounds, num_processes=2, ui="text", timeout=60)
    assert results[0]["rounds"] == results[1]["rounds"] >= 1
    assert all(r["kept"] for r in results)   # the group outlived destroy_process_group()


def _destroy_free_then_init_again():
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group()                      # env:// binds MASTER_PORT
    model = DDP(torch.nn.Linear(3, 1))
    model(torch.randn(4, 3)).sum().backward()
    dist.destroy_process_group()
    kept = _groups_kept_by_the_rank()
    del model
    dist.init_process_group()                      # binds MASTER_PORT again: the kept store is gone
    t = torch.ones(1)
    dist.all_reduce(t)
    dist.destroy_process_group()
    return {"kept": kept, "after_reinit": _groups_kept_by_the_rank(), "sum": t.item()}


def test_a_kept_group_is_let_go_before_the_next_init():
    """One rank, so no other rank can race the second rendezvous."""
    [result] = notebook_launcher(_destroy_free_then_init_again, num_processes=1, ui="text", timeout=120)
    assert result == {"kept": 1, "after_reinit": 0, "sum": 1.0}


def _ddp_in_this_process(port: int) -> int:
    """Build a DDP model on a one-process gloo group here; how many groups the patch then keeps."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from notebook_launch.rank.group import process_groups
    store = dist.TCPStore("127.0.0.1", port, 1, is_master=True, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        model = DDP(torch.nn.Linear(2, 2))
        model(torch.ones(1, 2)).sum().backward()
        return len(process_groups._kept)
    finally:
        dist.destroy_process_group()


def test_the_patch_is_made_in_the_notebook_once_and_does_nothing_there():
    """The patch is made in the notebook before a launch's forks (issue 45: made in every rank it
    cost each a third of a millisecond) and turned on in the ranks only: DDP and the rendezvous in
    the notebook itself keep no group, before and after a launch, while its ranks keep theirs."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from notebook_launch.planning.net import free_port
    from notebook_launch.rank.group import process_groups
    [in_rank] = notebook_launcher(_destroy_free_then_init_again, num_processes=1, ui="text", timeout=120)
    assert in_rank["kept"] == 1
    assert hasattr(DDP.__init__, "__wrapped__") and process_groups._patched_before_forks
    assert not process_groups._active and _ddp_in_this_process(free_port()) == 0
    assert not process_groups._kept
