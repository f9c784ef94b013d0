"""Item 9: one cell on a Ray cluster. On a real two-node Ray cluster (two network namespaces
joined by a veth pair, tests/raycluster/ray_two_nodes.py), driven from a Jupyter kernel on
node A, side by side and in rotating order:

- call to first trained DDP step, 4 ranks over 2 nodes: this project's
  ``notebook_launcher(..., cluster=RayCluster(...))`` vs Ray Train's ``TorchTrainer``
  (``ScalingConfig(num_workers=4)``) vs Accelerate-style same-cell-per-node (one already
  started Python per node, torch and accelerate imported, each calling Accelerate's
  ``notebook_launcher(num_processes=2, num_nodes=2, node_rank=i)`` at the same moment);
- the relay: output lines/s and progress updates/s from 4 ranks through the cluster into the
  notebook, and how much the relay slows the ranks' own loops (same loop with the output
  going nowhere).

Needs root and iproute2 (network namespaces); otherwise the rows say why they are missing.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from .common import REPO_ROOT
from .table import Cell, Row, fmt_ratio, ratio

sys.path.insert(0, os.path.join(REPO_ROOT, "tests", "raycluster"))

RANKS = 4
LINES_PER_RANK = 20000
UPDATES_PER_RANK = 200000

SETUP = """
import json, os, tempfile, time
import torch
from notebook_launch import notebook_launcher, RayCluster
HEAD = {head!r}

def first_step(*_):
    import torch, torch.distributed as dist
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 1))
    model(torch.ones(4, 16)).sum().backward()
    return time.time()

def loop_for_trainer(config):
    import ray.train, ray.train.torch
    model = ray.train.torch.prepare_model(torch.nn.Linear(16, 1))
    model(torch.ones(4, 16)).sum().backward()
    rank = ray.train.get_context().get_world_rank()
    open(os.path.join(config["out"], str(rank)), "w").write(repr(time.time()))

def relay(lines, updates, sink):
    import sys
    from notebook_launch import progress
    # the baseline: the same line-buffered writes into a file on the rank's own node
    out = tempfile.TemporaryFile("w", buffering=1) if sink == "local file" else sys.stdout
    start = time.perf_counter()
    for i in range(lines):
        print(f"line {{i}} of a rank's output, about sixty characters long ....", file=out)
    out.flush()
    lines_s = time.perf_counter() - start
    start = time.perf_counter()
    if sink == "local file":
        for i in range(updates):
            pass
    else:
        for i in progress(range(updates), desc="relay"):
            pass
    return lines_s, time.perf_counter() - start

print(json.dumps(True))
"""

OURS = """
t0 = time.time()
steps = notebook_launcher(first_step, num_processes={ranks}, cluster=RayCluster(address=HEAD, placement="SPREAD"),
                          ui="none")
print(json.dumps(max(steps) - t0))
"""

TRAINER = """
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer
out = tempfile.mkdtemp()
t0 = time.time()
TorchTrainer(loop_for_trainer, train_loop_config={{"out": out}},
             scaling_config=ScalingConfig(num_workers={ranks}, placement_strategy="SPREAD"),
             run_config=RunConfig(storage_path=tempfile.mkdtemp(), name="bench")).fit()
print(json.dumps(max(float(open(os.path.join(out, f)).read()) for f in os.listdir(out)) - t0))
"""

RELAY = """
t0 = time.time()
timings = notebook_launcher(relay, args=({lines}, {updates}, {sink!r}), num_processes={ranks},
                            cluster=RayCluster(address=HEAD, placement="SPREAD"), ui="text")
print(json.dumps(timings))
"""

# One "notebook" per node for the Accelerate-style row: imports first (untimed), then waits for "go".
NODE_SCRIPT = """
import sys, time, torch, torch.distributed as dist
from accelerate import notebook_launcher
def first_step(out):
    dist.init_process_group("gloo")
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 1))
    model(torch.ones(4, 16)).sum().backward()
    open(f"{out}-{dist.get_rank()}", "w").write(repr(time.time()))
print("ready", flush=True)
node_rank, master, port, out = sys.stdin.readline().split()
notebook_launcher(first_step, args=(out,), num_processes=2, num_nodes=2, node_rank=int(node_rank),
                  master_addr=master, use_port=port)
print("done", flush=True)
"""


def run(config: dict, log_dir: str, say=print) -> list[Row]:
    from ray_two_nodes import RayTwoNodes, unavailable_reason
    rows = [Row("9", "Ray cluster: call to first trained DDP step (4 ranks, 2 nodes)", str(RANKS), "s",
                goal="≥3x faster than TorchTrainer", group=9),
            Row("9", "Ray cluster: relay of output lines / progress updates into the notebook (4 ranks)",
                str(RANKS), "/s", goal="— (throughput)", group=9),
            Row("9", "Ray cluster: rank's print loop, relayed / into a local file (20k lines)", str(RANKS), "x",
                goal="— (cost)", group=9)]
    reason = unavailable_reason()
    if reason:
        for row in rows:
            row.cell("ours").text = f"not measured: {reason}"
        return rows
    nodes = RayTwoNodes(Path(log_dir), bind_gloo_in_node_env=True, cpus_per_node=4)
    try:
        say("item 9: starting a two-node Ray cluster")
        nodes.up()
        nodes.notebook.value(SETUP.format(head=nodes.head), timeout=300)
        measure_first_step(nodes, rows[0], config["repeats"], log_dir, say)
        measure_relay(nodes, rows[1], rows[2], config, say)
    finally:
        nodes.down()
    return rows


def measure_first_step(nodes, row: Row, repeats: int, log_dir: str, say) -> None:
    trainer = Cell(label="Ray Train TorchTrainer")
    row.cells["other"] = [trainer]
    order = ["ours", "trainer", "accelerate"]
    for repeat in range(repeats):
        for name in order[repeat % 3:] + order[:repeat % 3]:
            say(f"item 9: first step, {name}, repeat {repeat + 1}/{repeats}")
            try:
                if name == "ours":
                    row.cell("ours").samples.append(nodes.notebook.value(OURS.format(ranks=RANKS), timeout=600))
                elif name == "trainer":
                    trainer.samples.append(nodes.notebook.value(TRAINER.format(ranks=RANKS), timeout=600))
                else:
                    row.cell("accelerate").samples.append(accelerate_per_node(nodes, log_dir, repeat))
            except Exception as exc:  # one launcher failing must not lose the others' rows
                say(f"item 9: {name} failed: {exc}")
                cell = trainer if name == "trainer" else row.cell(name)
                cell.text = f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
    speedup = ratio(trainer.median(), row.median("ours"))
    versus_accelerate = ratio(row.median("accelerate"), row.median("ours"))
    row.ratios = (f"TorchTrainer/ours {fmt_ratio(speedup)}; Accelerate-style per node/ours "
                  f"{fmt_ratio(versus_accelerate)}")
    row.met = "n/a" if speedup is None else ("yes" if speedup >= 3 else "no")


def accelerate_per_node(nodes, log_dir: str, repeat: int) -> float:
    """Both node 'notebooks' are started and import everything first; then both get "go" at once."""
    out = os.path.join(log_dir, f"accelerate-first-step-{repeat}")
    procs = []
    try:
        for node in (0, 1):
            env = dict(nodes.env, GLOO_SOCKET_IFNAME=nodes.links[node])
            procs.append(subprocess.Popen(
                ["ip", "netns", "exec", nodes.namespaces[node], sys.executable, "-c", NODE_SCRIPT],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env))
        for proc in procs:
            assert proc.stdout is not None  # a pipe, as asked above
            line = proc.stdout.readline()
            if line.strip() != "ready":
                raise RuntimeError(f"a node process did not start: {line}{proc.stdout.read()}")
        t0 = time.time()
        for node, proc in enumerate(procs):
            assert proc.stdin is not None  # a pipe, as asked above
            proc.stdin.write(f"{node} {nodes.addresses[0]} 29555 {out}\n")
            proc.stdin.flush()
        for proc in procs:
            tail = proc.communicate(timeout=600)[0]
            if proc.returncode != 0:
                raise RuntimeError(f"a node's notebook_launcher failed: {tail[-500:]}")
        return max(float(Path(f"{out}-{rank}").read_text()) for rank in range(RANKS)) - t0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def measure_relay(nodes, rates: Row, cost: Row, config: dict, say) -> None:
    lines = LINES_PER_RANK // (10 if config["quick"] else 1)
    updates = UPDATES_PER_RANK // (10 if config["quick"] else 1)
    for repeat in range(config["repeats"]):
        say(f"item 9: relay, repeat {repeat + 1}/{config['repeats']}")
        relayed = nodes.notebook.value(RELAY.format(lines=lines, updates=updates, sink="notebook", ranks=RANKS),
                                       timeout=600)
        local = nodes.notebook.value(RELAY.format(lines=lines, updates=updates, sink="local file", ranks=RANKS),
                                     timeout=600)
        slowest_lines = max(t[0] for t in relayed)
        slowest_updates = max(t[1] for t in relayed)
        rates.cell("ours").samples.append(RANKS * lines / slowest_lines)
        rates.cells.setdefault("other", [Cell(label="progress updates/s")])[0].samples.append(
            RANKS * updates / slowest_updates)
        cost.cell("ours").samples.append(slowest_lines / max(t[0] for t in local))
    rates.ratios = "lines/s in the ours column; progress() updates/s (batched to 10 events/s per rank) in other"
    cost.ratios = "1.00x = relaying a line costs the rank what writing it to a local file does"


NOTES = ("Item 9 (Ray): a real two-node Ray cluster on this machine (two network namespaces joined by a veth "
         "pair, `ray start --head` / `ray start --address`, 4 logical CPUs per node, dashboard off), driven "
         "from a Jupyter kernel on node A; every sample is a new launch on the running cluster (its actors "
         "start new worker processes, which import torch). The nodes were started with GLOO_SOCKET_IFNAME "
         "naming their link because TorchTrainer and Accelerate do not find it themselves; this project "
         "sets it per rank from the node's address. Accelerate-style: one Python per node with torch and "
         "accelerate imported (untimed), then both call `notebook_launcher(num_processes=2, num_nodes=2, "
         "node_rank=i)` at once; time to the last rank's first step. TorchTrainer: `fit()` with "
         "`ScalingConfig(num_workers=4, placement_strategy='SPREAD')`, time to the last worker's first "
         "step (each writes its time to a file; `fit()` itself returns later). Relay: each rank prints 20k "
         "lines and runs a 200k-step progress() loop; "
         "rates are over the slowest rank; the cost row compares the same line-buffered print loop into a "
         "local file on the rank's node.")
