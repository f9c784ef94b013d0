"""Run inside an anchor's own venv (scripts/setup-anchors.sh): times Meta's Monarch persistent
actors or torchrunx launches, and prints one JSON line. Imports nothing of this project, so the
anchor's venv needs only torch and the anchor (``benchmarks.common`` is the standard library's only).

    .venv-monarch/bin/python -m benchmarks.anchor_probe monarch   (then {"op": "calls", "calls": N} lines)
    .venv-torchrunx/bin/python -m benchmarks.anchor_probe torchrunx RANKS REPEATS
"""
from __future__ import annotations

import json
import os
import sys
import time

from .common import free_port   # the standard library's only: the anchor's venv has it too


# A DDP step on a model kept in each rank, as a notebook's cell defines it: executed into the
# 'ours' worker's ``__main__`` (``ranks.run`` sends the functions by value) and into each Monarch
# actor's own namespace. ``port``: a rendezvous of its own (Monarch's procs have no launcher's
# environment); None: the launcher's (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).
DDP_CELL = """
def ddp_setup(width, rank=None, world_size=None, port=None):
    global model, optimizer, batch
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    if port is None:
        dist.init_process_group("gloo")
    else:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    torch.manual_seed(0)
    layers = [torch.nn.Linear(width, width), torch.nn.ReLU()] * 3 + [torch.nn.Linear(width, 1)]
    model = DistributedDataParallel(torch.nn.Sequential(*layers))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batch = torch.randn(256, width), torch.randn(256, 1)
    ddp_step()
    return dist.get_rank()


def ddp_step():
    import torch
    x, y = batch
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return float(loss.detach())
"""


def monarch_session(commands, reply) -> None:
    """Start to the first call on 2 procs (an actor spawned on each), replied at once; then, for
    each ``{"op": "calls", "calls": N}`` read from ``commands``, N warm calls of a trivial
    endpoint, each ``.call().get()`` (every proc's value back, as ``ranks.run``), their times
    replied: one JSON line each way, as benchmarks/worker.py speaks; ``{"op": "exit"}`` or the
    end of input ends it; ``{"op": "ddp_setup", "width": W}`` builds a DDP model in each actor
    (``DDP_CELL``), after which ``"what": "ddp"`` calls are its training steps. Served this way
    so that the harness can alternate short blocks of Monarch's calls with ours, both measured
    in the same moments of the machine."""
    from monarch.actor import Actor, current_rank, endpoint, this_host

    class Trivial(Actor):
        def __init__(self) -> None:
            self.cell: dict = {}
            exec(compile(DDP_CELL, "<notebook cell>", "exec"), self.cell)

        @endpoint
        def rank(self) -> int:
            return int(current_rank().rank)

        @endpoint
        def ddp_setup(self, width: int, port: int) -> int:
            import torch
            # as our ranks set it (the cores shared among the ranks): Monarch leaves each proc
            # torch's default, every core, and 2 procs x 2 threads on 2 cores made a step 7-10x slower
            torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // 2))
            return self.cell["ddp_setup"](width, int(current_rank().rank), 2, port)

        @endpoint
        def ddp_step(self) -> float:
            return self.cell["ddp_step"]()

    started = time.perf_counter()
    procs = this_host().spawn_procs(per_host={"procs": 2})
    actors = procs.spawn("trivial", Trivial)
    first = actors.rank.call().get()
    to_first = time.perf_counter() - started
    reply({"start_to_first": to_first, "values": sorted(value for _, value in first.items())})
    for line in commands:
        command = json.loads(line)
        if command.get("op") == "ddp_setup":
            ranks = actors.ddp_setup.call(command["width"], free_port()).get()
            reply({"ranks": sorted(value for _, value in ranks.items())})
            continue
        if command.get("op") != "calls":
            break
        endpoint_of = actors.ddp_step if command.get("what") == "ddp" else actors.rank
        samples = []
        for _ in range(int(command["calls"])):
            began = time.perf_counter()
            endpoint_of.call().get()
            samples.append(time.perf_counter() - began)
        reply({"warm": samples})


def trivial() -> int:
    return int(os.environ.get("RANK", "0"))


def torchrunx_launches(ranks: int, repeats: int) -> dict:
    """``repeats`` launches of a trivial function on ``ranks`` local workers after one warm-up,
    each returning every rank's value (``LaunchResult``)."""
    import torchrunx
    launcher = torchrunx.Launcher(hostnames=["localhost"], workers_per_host=ranks, backend=None)
    launcher.run(trivial)
    samples, values = [], []
    for _ in range(repeats):
        began = time.perf_counter()
        result = launcher.run(trivial)
        samples.append(time.perf_counter() - began)
        values = [result.rank(i) for i in range(ranks)]
    return {"launch": samples, "values": values}


def main(argv: list[str]) -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    reply = os.dup(1)
    os.dup2(devnull, 1)   # what the anchor prints goes nowhere, as the 'ours' worker's does

    def send(out: dict) -> None:
        os.write(reply, (json.dumps(out) + "\n").encode())

    if argv[0] == "monarch":
        monarch_session(sys.stdin, send)
    elif argv[0] == "torchrunx":
        send(torchrunx_launches(int(argv[1]), int(argv[2])))
    else:
        raise SystemExit(f"anchor_probe: unknown anchor {argv[0]!r}")
    sys.stdout.flush()
    os._exit(0)   # the anchors' runtimes (Monarch's Rust one) stop with the process


if __name__ == "__main__":
    main(sys.argv[1:])
