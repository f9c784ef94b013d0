"""The functions every launcher runs. Module-level, so each launcher gets the very same code."""
from __future__ import annotations

import os


def trivial():
    """Returns at once: what is left is the launcher's own cost, call to return."""
    return int(os.environ.get("RANK", "0"))


def first_step():
    """Time to the first trained step: gloo init, a small model in DDP, one
    forward/backward/optimizer step, then return.

    The process group is left to the rank's exit (every launcher measured ends
    its ranks with os._exit, so nothing is torn down). Not calling
    destroy_process_group() here is deliberate: destroying it and then freeing
    the DDP model can deadlock in ~ProcessGroupGloo (the main thread joins a
    gloo thread while holding the GIL; that thread waits for the GIL), seen
    here once torch._dynamo was imported before the fork. Only a launch that
    runs inside the caller (Accelerate with 1 process) must clean up, so the
    next call can initialize again; it frees the model first."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    in_caller = "RANK" not in os.environ  # Accelerate runs a 1-process launch inside the caller
    if in_caller:
        from .common import free_port
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    else:
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 32), torch.randn(16, 1)
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    value = float(loss.detach())
    if in_caller:
        del model, opt, loss
        dist.destroy_process_group()
    return value


WORKLOADS = {"trivial": trivial, "first_step": first_step}


def rank_uss() -> int:
    """Bytes only this process holds (unique set size): shared copy-on-write pages do not count."""
    import psutil
    return psutil.Process().memory_full_info().uss


def every_rank_got_here():
    """A barrier before a rank reads its USS: a page that the ranks share (spawn: the argument's
    memfd) counts as one rank's own until another rank has mapped it too, so without it the
    spawn row read 0 or the whole tensor depending on which rank got there first."""
    if int(os.environ.get("WORLD_SIZE", "1")) < 2:
        return
    import torch.distributed as dist
    dist.init_process_group("gloo")
    dist.barrier()
    dist.destroy_process_group()


def memory_probes(big):
    """Functions that differ only in what they do with ``big``: read every
    byte of it, ignore it, or write every byte (the calibration: a write must
    copy under fork, so the method must show about the tensor's size)."""
    def holds_tensor():
        checksum = float(big.sum())
        every_rank_got_here()
        return {"uss": rank_uss(), "checksum": checksum}

    def holds_nothing():
        every_rank_got_here()
        return {"uss": rank_uss(), "checksum": 0.0}

    def writes_tensor():
        big.add_(0.0)
        every_rank_got_here()
        return {"uss": rank_uss(), "checksum": 0.0}

    return {"read": holds_tensor, "nothing": holds_nothing, "write": writes_tensor}
