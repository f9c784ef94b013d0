"""The functions every launcher runs. Module-level, so each launcher gets the very same code."""
from __future__ import annotations

import os


def trivial():
    """Returns at once: what is left is the launcher's own cost, call to return."""
    return int(os.environ.get("RANK", "0"))


def first_step():
    """Time to the first trained step: gloo init, a small model in DDP, one
    forward/backward/optimizer step, then a clean shutdown."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    if "RANK" in os.environ:
        dist.init_process_group("gloo")
    else:  # Accelerate runs a 1-process launch inside the caller, without the env
        from .common import free_port
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x, y = torch.randn(16, 32), torch.randn(16, 1)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return float(loss.detach())
    finally:
        dist.destroy_process_group()


WORKLOADS = {"trivial": trivial, "first_step": first_step}


def rank_uss() -> int:
    """Bytes only this process holds (unique set size): shared copy-on-write pages do not count."""
    import psutil
    return psutil.Process().memory_full_info().uss


def memory_probes(big):
    """Two functions that differ only in closing over ``big``: the first reads
    every byte of it (read-only), then both report their rank's USS."""
    def holds_tensor():
        checksum = float(big.sum())
        return {"uss": rank_uss(), "checksum": checksum}

    def holds_nothing():
        return {"uss": rank_uss(), "checksum": 0.0}

    return holds_tensor, holds_nothing
