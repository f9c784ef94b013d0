"""Item 7: persistent ranks (start_ranks), side by side in one worker process.

Row "trivial call": a trivial function on 2 warm persistent ranks (``ranks.run``), against a
fresh ``notebook_launcher`` launch of the same function and ipyparallel's ``view.apply_sync``
on 2 engines started locally. Each repeat takes CALLS_PER_REPEAT samples of the two
call-style rows and one launch, in an order that rotates every repeat.

Row "DDP step": a training step of a DDP model kept in the ranks, run as a new ``ranks.run``
(timed in the notebook, call to return) against one step inside a call (timed in rank 0).
"""
from __future__ import annotations

import contextlib
import os
import time
from typing import TYPE_CHECKING

from .table import Cell, Row, fmt_ratio, ratio
from .worker import Worker, WorkerError

CALLS_PER_REPEAT = 10
STEPS_INSIDE = 20
GOAL_MS = 3.0
GOAL_VS_LAUNCH = 10.0
GOAL_VS_IPYPARALLEL = 2.0
GOAL_STEP_RATIO = 1.10


# --- in the worker process ---------------------------------------------------------------

if TYPE_CHECKING:
    import torch

# What build_ddp leaves in each rank for one_step (a rank's globals live as long as the persistent rank).
model: torch.nn.Module
optimizer: torch.optim.Optimizer
batch: tuple[torch.Tensor, torch.Tensor]


def trivial() -> int:
    return int(os.environ.get("RANK", "0"))


def build_ddp(width: int) -> int:
    global model, optimizer, batch
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    layers = [torch.nn.Linear(width, width), torch.nn.ReLU()] * 3 + [torch.nn.Linear(width, 1)]
    model = DDP(torch.nn.Sequential(*layers))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batch = torch.randn(256, width), torch.randn(256, 1)
    one_step()
    return dist.get_rank()


def one_step() -> float:
    import torch
    x, y = batch
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return float(loss.detach())


def steps_inside(count: int) -> list:
    """Seconds of each of ``count`` steps, timed inside the rank."""
    seconds = []
    for _ in range(count):
        started = time.perf_counter()
        one_step()
        seconds.append(time.perf_counter() - started)
    return seconds


def rotated(names, shift):
    shift %= len(names)
    return names[shift:] + names[:shift]


def measure_in_worker(repeats: int, width: int) -> dict:
    """The whole item in one process (the 'ours' worker: fd 1 is /dev/null)."""
    from notebook_launch import notebook_launcher, start_ranks

    from .anchors import notebook_function
    from .common import free_port
    trivial = notebook_function()   # a notebook's function (__main__, cloudpickled by value), as a user's is
    samples: dict = {"persistent": [], "launch": [], "ipyparallel": [], "new_run": [], "inside": []}
    view, cluster, not_available = None, None, None
    try:
        import ipyparallel
        cluster = ipyparallel.Cluster(n=2, log_level=40)
        client = cluster.start_and_connect_sync()
        client.wait_for_engines(2, timeout=300)
        view = client[:]
        view.apply_sync(trivial)
    except Exception as exc:   # reported in the table instead of a number
        not_available = f"{type(exc).__name__}: {exc}"[:200]
    with start_ranks(2, use_port=free_port()) as ranks:
        ranks.run(trivial)
        notebook_launcher(trivial, num_processes=2, use_port=free_port())
        timed = {
            "persistent": lambda: ranks.run(trivial),
            "launch": lambda: notebook_launcher(trivial, num_processes=2, use_port=free_port()),
            "ipyparallel": (lambda: view.apply_sync(trivial)) if view is not None else None,
        }
        for repeat in range(repeats):
            for name in rotated(list(timed), repeat):
                call = timed[name]
                if call is None:
                    continue
                for _ in range(1 if name == "launch" else CALLS_PER_REPEAT):
                    started = time.perf_counter()
                    call()
                    samples[name].append(time.perf_counter() - started)
        # ipyparallel's controller and engines (5 processes, each with its own heartbeat and
        # event loops) are done: on 2 cores they would take turns with the DDP ranks below.
        stop_ipyparallel(cluster)
        ranks.run(build_ddp, args=(width,))
        for repeat in range(repeats):   # as many steps each way, alternating which goes first
            for way in rotated(["new_run", "inside"], repeat):
                if way == "inside":
                    samples["inside"] += ranks.run(steps_inside, args=(STEPS_INSIDE,))[0]
                    continue
                for _ in range(STEPS_INSIDE):
                    started = time.perf_counter()
                    ranks.run(one_step)
                    samples["new_run"].append(time.perf_counter() - started)
    samples["ipyparallel_not_available"] = not_available
    return samples


def stop_ipyparallel(cluster) -> None:
    if cluster is not None:
        with contextlib.suppress(Exception):   # engines end with the worker anyway
            cluster.stop_cluster_sync()


# --- in the harness ----------------------------------------------------------------------

def run(config: dict, log_dir: str, say) -> list:
    say("item 7: persistent ranks, ipyparallel, a fresh launch")
    width = 64 if config["quick"] else 512
    worker = Worker("ours", log_dir=log_dir)
    try:
        reply = worker.ask(op="persistent", repeats=config["repeats"], width=width)
        error = None
    except WorkerError as exc:
        reply, error = {}, f"error: {exc}"
    finally:
        worker.close()
    return [trivial_row(reply, error), step_row(reply, error, width)]


def trivial_row(reply: dict, error) -> Row:
    row = Row(item="7", measurement=f"trivial call on warm persistent ranks (`ranks.run`, {CALLS_PER_REPEAT} "
              "calls per repeat) vs a fresh `notebook_launcher` launch vs ipyparallel `view.apply_sync` "
              "(2 local engines)", ranks="2", unit="s", group=7,
              goal=f"median <= {GOAL_MS:g} ms; >= {GOAL_VS_LAUNCH:g}x faster than a launch; "
                   f">= {GOAL_VS_IPYPARALLEL:g}x faster than ipyparallel")
    ours = row.cell("ours")
    ours.label = "persistent run()"
    launch = Cell(label="notebook_launcher launch")
    ipp = Cell(label="ipyparallel apply_sync")
    row.cells["other"] = [launch, ipp]
    if error:
        ours.text = error
        return row
    ours.samples = reply["persistent"]
    launch.samples = reply["launch"]
    ipp.samples = reply["ipyparallel"]
    if reply.get("ipyparallel_not_available"):
        ipp.text = f"not available: {reply['ipyparallel_not_available']}"
    vs_launch = ratio(launch.median(), ours.median())
    vs_ipp = ratio(ipp.median(), ours.median())
    row.ratios = f"launch/persistent {fmt_ratio(vs_launch)}; ipyparallel/persistent {fmt_ratio(vs_ipp)}"
    met = (ours.median() is not None and ours.median() * 1000 <= GOAL_MS and vs_launch is not None
           and vs_launch >= GOAL_VS_LAUNCH and vs_ipp is not None and vs_ipp >= GOAL_VS_IPYPARALLEL)
    row.met = "yes" if met else "**NO (missed)**"
    return row


def step_row(reply: dict, error, width: int) -> Row:
    row = Row(item="7", measurement="a DDP step on the model kept in the ranks: in a new `ranks.run` "
              f"(call to return) vs one step inside a call (timed in rank 0), {STEPS_INSIDE} of each per "
              f"repeat; 4 layers of {width}, batch 256",
              ranks="2", unit="s", group=7, goal=f"new run() within {int((GOAL_STEP_RATIO - 1) * 100)}% "
                                                  "of a step inside one call")
    ours = row.cell("ours")
    ours.label = "step in a new run()"
    inside = Cell(label="step inside one call")
    row.cells["other"] = [inside]
    if error:
        ours.text = error
        return row
    ours.samples = reply["new_run"]
    inside.samples = reply["inside"]
    value = ratio(ours.median(), inside.median())
    row.ratios = f"new run()/inside {fmt_ratio(value)}"
    row.met = "yes" if value is not None and value <= GOAL_STEP_RATIO else "**NO (missed)**"
    return row
