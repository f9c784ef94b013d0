"""A small real training on 2 CPU ranks: DDP over gloo, synthetic regression data.

Run:  .venv/bin/python examples/train_cpu.py
"""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from notebook_launch import notebook_launcher


def train(steps: int = 200, lr: float = 0.05):
    dist.init_process_group()                      # env:// from the launcher
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    true_w = torch.tensor([[2.0], [-3.0], [0.5]])
    model = DDP(torch.nn.Linear(3, 1))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(1 + rank)  # each rank sees its own shard
    for step in range(steps):
        x = torch.randn(64, 3, generator=gen)
        y = x @ true_w + 1.0
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0 and rank == 0:
            print(f"step {step:4d}  loss {loss.item():.4f}")
    weights = model.module.weight.detach().clone()
    dist.destroy_process_group()
    return {"rank": rank, "world": world, "loss": loss.item(), "weight": weights}


if __name__ == "__main__":
    results = notebook_launcher(train, args=(200,), num_processes=2)
    for r in results:
        print(f"rank {r['rank']}/{r['world']}: final loss {r['loss']:.5f}, weight {r['weight'].flatten().tolist()}")
    assert torch.equal(results[0]["weight"], results[1]["weight"]), "ranks diverged"
    print("OK: both ranks hold the same trained weights")
