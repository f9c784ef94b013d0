"""Plain torch.distributed code runs unchanged inside launched ranks."""
from __future__ import annotations

import os

import torch

from notebook_launch import notebook_launcher

N = 2


def _collectives():
    import torch.distributed as dist
    dist.init_process_group()                    # no arguments: env:// from the launcher
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)                           # default op: SUM
    m = torch.tensor([float(rank)])
    dist.all_reduce(m, op=dist.ReduceOp.MAX)
    gathered = [torch.zeros(2) for _ in range(world)]
    dist.all_gather(gathered, torch.tensor([rank, rank * 2.0]))
    b = torch.tensor([42.0 if rank == 0 else 0.0])
    dist.broadcast(b, src=0)
    dist.barrier()
    out = {"rank": rank, "world": world, "backend": dist.get_backend_config(), "sum": t.item(),
           "max": m.item(), "gathered": torch.stack(gathered), "broadcast": b.item(),
           "env_rank": int(os.environ["RANK"]), "local_rank": int(os.environ["LOCAL_RANK"])}
    dist.destroy_process_group()
    return out


def test_init_process_group_without_arguments_and_collectives():
    results = notebook_launcher(_collectives, num_processes=N, ui="text", timeout=240)
    assert [r["rank"] for r in results] == list(range(N))
    for r in results:
        assert r["world"] == N and "cpu:gloo" in r["backend"], r["backend"]
        assert r["sum"] == N * (N + 1) / 2
        assert r["max"] == N - 1
        assert r["gathered"].tolist() == [[i, 2.0 * i] for i in range(N)]
        assert r["broadcast"] == 42.0
        assert r["env_rank"] == r["rank"] == r["local_rank"]


def _ddp_train(steps=30):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler

    dist.init_process_group()
    torch.manual_seed(0)
    x = torch.randn(256, 3)
    y = x @ torch.tensor([[2.0], [-3.0], [0.5]]) + 1.0
    sampler: DistributedSampler = DistributedSampler(TensorDataset(x, y), shuffle=True, seed=0)
    loader = DataLoader(TensorDataset(x, y), batch_size=16, sampler=sampler)
    model = DDP(torch.nn.Linear(3, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses, seen = [], []
    for epoch in range(steps // len(loader) + 1):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        seen.append(len(loader))
    dist.barrier()
    state = {k: v.detach().clone() for k, v in model.module.state_dict().items()}
    # The usual ending, with the DDP model still alive: torch 2.13 alone can deadlock freeing the
    # gloo group from DDP's Reducer afterwards; notebook_launch.rank.group.process_groups prevents it.
    dist.destroy_process_group()
    return {"first": losses[0], "last": losses[-1], "state": state, "batches": seen[0]}


def test_ddp_training_reaches_the_same_weights_on_every_rank():
    results = notebook_launcher(_ddp_train, num_processes=N, ui="text", timeout=240)
    r0, r1 = results
    assert r0["batches"] == 256 // 16 // N             # DistributedSampler shards the data
    for key in r0["state"]:
        assert torch.equal(r0["state"][key], r1["state"][key]), key
    assert r0["last"] < r0["first"] / 10
    assert torch.allclose(r0["state"]["weight"], torch.tensor([[2.0, -3.0, 0.5]]), atol=0.2)

