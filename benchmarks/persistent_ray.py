"""Item 12: persistent ranks on a Ray cluster (``start_ranks(4, cluster=RayCluster(...))``).

On a real two-node Ray cluster (two network namespaces joined by a veth pair,
tests/raycluster/ray_two_nodes.py), driven from a Jupyter kernel on node A:

- trivial call: ``ranks.run`` on 4 warm persistent ranks (2 per node) vs a fresh cluster launch
  of the same function (``notebook_launcher(..., cluster=RayCluster(...))``) vs ipyparallel's
  ``view.apply_sync`` on 4 engines (2 per node: one controller on node A, engines started in
  each node's namespace). Each repeat takes CALLS_PER_REPEAT samples of the call-style rows
  and one launch, in an order that rotates every repeat;
- DDP step: a training step of a DDP model kept in the ranks (its all-reduce crosses the two
  nodes), run as a new ``ranks.run`` (timed in the notebook, call to return) vs one step inside
  a call (timed in rank 0).

Needs root and iproute2 (network namespaces); otherwise the rows say why they are missing.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .common import REPO_ROOT
from .table import Cell, Row, fmt_ratio, ratio

sys.path.insert(0, os.path.join(REPO_ROOT, "tests", "raycluster"))

RANKS = 4
CALLS_PER_REPEAT = 10
STEPS_INSIDE = 20
GOAL_VS_LAUNCH = 10.0
GOAL_STEP_RATIO = 1.10
ENGINE_WAIT = 300

SETUP = """
import json, os, time
from notebook_launch import notebook_launcher, start_ranks, RayCluster
HEAD = {head!r}
def cluster():
    return RayCluster(address=HEAD, placement="SPREAD")

def trivial():
    import os
    return int(os.environ.get("RANK", "0"))

def build_ddp(width):
    global model, optimizer, batch
    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    layers = [torch.nn.Linear(width, width), torch.nn.ReLU()] * 3 + [torch.nn.Linear(width, 1)]
    model = DDP(torch.nn.Sequential(*layers))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batch = torch.randn(256, width), torch.randn(256, 1)
    one_step()
    return dist.get_rank()

def one_step():
    import torch
    x, y = batch
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return float(loss.detach())

def steps_inside(count):
    seconds = []
    for _ in range(count):
        started = time.perf_counter()
        one_step()
        seconds.append(time.perf_counter() - started)
    return seconds

def rotated(names, shift):
    shift %= len(names)
    return names[shift:] + names[:shift]

print(json.dumps(True))
"""

MEASURE = """
samples = {{"persistent": [], "launch": [], "ipyparallel": [], "new_run": [], "inside": [], "ipp_error": None}}
view = None
try:
    import ipyparallel
    client = ipyparallel.Client(profile_dir={profile!r})
    client.wait_for_engines({ranks}, timeout={engine_wait})
    view = client[:]
    view.apply_sync(trivial)
except Exception as exc:
    samples["ipp_error"] = f"{{type(exc).__name__}}: {{exc}}"[:200]
with start_ranks({ranks}, cluster=cluster(), ui="none") as ranks:
    ranks.run(trivial)
    notebook_launcher(trivial, num_processes={ranks}, cluster=cluster(), ui="none")
    timed = {{"persistent": lambda: ranks.run(trivial),
             "launch": lambda: notebook_launcher(trivial, num_processes={ranks}, cluster=cluster(), ui="none"),
             "ipyparallel": (lambda: view.apply_sync(trivial)) if view is not None else None}}
    for repeat in range({repeats}):
        for name in rotated(list(timed), repeat):
            call = timed[name]
            if call is None:
                continue
            for _ in range(1 if name == "launch" else {calls}):
                started = time.perf_counter()
                call()
                samples[name].append(time.perf_counter() - started)
    if view is not None:
        client.close()
    ranks.run(build_ddp, args=({width},))
    for repeat in range({repeats}):
        for way in rotated(["new_run", "inside"], repeat):
            if way == "inside":
                samples["inside"] += ranks.run(steps_inside, args=({steps},))[0]
                continue
            for _ in range({steps}):
                started = time.perf_counter()
                ranks.run(one_step)
                samples["new_run"].append(time.perf_counter() - started)
print(json.dumps(samples))
"""


def run(config: dict, log_dir: str, say=print) -> list[Row]:
    from ray_two_nodes import RayTwoNodes, unavailable_reason
    width = 64 if config["quick"] else 512
    rows = [trivial_row(), step_row(width)]
    reason = unavailable_reason()
    if reason:
        for row in rows:
            row.cell("ours").text = f"not measured: {reason}"
        return rows
    # 4 logical CPUs per node: the warm ranks (4) and a fresh launch (4) are on the cluster at once
    nodes = RayTwoNodes(Path(log_dir), cpus_per_node=4)
    engines: list[subprocess.Popen] = []
    profile = Path(log_dir) / "ipyparallel-profile"
    try:
        say("item 12: starting a two-node Ray cluster")
        nodes.up()
        nodes.notebook.value(SETUP.format(head=nodes.head), timeout=300)
        try:
            engines = start_ipyparallel(nodes, profile)
        except Exception as exc:   # reported in its cell, the other rows still run
            say(f"item 12: ipyparallel did not start: {exc}")
        say("item 12: measuring")
        reply = nodes.notebook.value(MEASURE.format(
            profile=str(profile), ranks=RANKS, engine_wait=ENGINE_WAIT if engines else 1, repeats=config["repeats"],
            calls=CALLS_PER_REPEAT, width=width, steps=STEPS_INSIDE), timeout=3600)
        fill_trivial(rows[0], reply)
        fill_step(rows[1], reply)
    except Exception as exc:
        say(f"item 12 failed: {exc}")
        for row in rows:
            row.cell("ours").text = f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    finally:
        for proc in engines:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        nodes.down()
        shutil.rmtree(profile, ignore_errors=True)
    return rows


def start_ipyparallel(nodes, profile: Path) -> list[subprocess.Popen]:
    """An ipcontroller on node A (listening on its link) and two ipengines in each node's namespace."""
    bin_dir = Path(sys.executable).parent
    profile.mkdir(parents=True, exist_ok=True)
    procs = [subprocess.Popen(["ip", "netns", "exec", nodes.namespaces[0], str(bin_dir / "ipcontroller"),
                               f"--profile-dir={profile}", f"--ip={nodes.addresses[0]}", "--log-level=ERROR"],
                              env=nodes.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    engine_file = profile / "security" / "ipcontroller-engine.json"
    deadline = time.monotonic() + 120
    while not engine_file.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    if not engine_file.exists():
        procs[0].kill()
        raise RuntimeError("ipcontroller wrote no connection file within 120 s")
    for node in (0, 1):
        for _ in range(RANKS // 2):
            procs.append(subprocess.Popen(["ip", "netns", "exec", nodes.namespaces[node], str(bin_dir / "ipengine"),
                                           f"--profile-dir={profile}", "--log-level=ERROR"],
                                          env=nodes.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return procs


def trivial_row() -> Row:
    row = Row(item="12", measurement=f"Ray cluster: trivial call on 4 warm persistent ranks over 2 nodes "
              f"(`ranks.run`, {CALLS_PER_REPEAT} calls per repeat) vs a fresh cluster launch vs ipyparallel "
              "`view.apply_sync` (4 engines, 2 per node)", ranks=str(RANKS), unit="s", group=12,
              goal=f">= {GOAL_VS_LAUNCH:g}x faster than a fresh cluster launch")
    row.cell("ours").label = "persistent run() on Ray"
    row.cells["other"] = [Cell(label="notebook_launcher(cluster=) launch"), Cell(label="ipyparallel apply_sync")]
    return row


def fill_trivial(row: Row, reply: dict) -> None:
    ours = row.cell("ours")
    launch, ipp = row.cells["other"]
    ours.samples, launch.samples, ipp.samples = reply["persistent"], reply["launch"], reply["ipyparallel"]
    if reply.get("ipp_error"):
        ipp.text = f"not available: {reply['ipp_error']}"
    vs_launch = ratio(launch.median(), ours.median())
    vs_ipp = ratio(ipp.median(), ours.median())
    row.ratios = f"launch/persistent {fmt_ratio(vs_launch)}; ipyparallel/persistent {fmt_ratio(vs_ipp)}"
    row.met = "yes" if vs_launch is not None and vs_launch >= GOAL_VS_LAUNCH else "**NO (missed)**"


def step_row(width: int) -> Row:
    row = Row(item="12", measurement="Ray cluster: a DDP step on the model kept in the ranks (all-reduce over "
              f"2 nodes): in a new `ranks.run` (call to return) vs one step inside a call (timed in rank 0), "
              f"{STEPS_INSIDE} of each per repeat; 4 layers of {width}, batch 256", ranks=str(RANKS), unit="s",
              group=12, goal=f"new run() within {int(round((GOAL_STEP_RATIO - 1) * 100))}% of a step inside one call")
    row.cell("ours").label = "step in a new run()"
    row.cells["other"] = [Cell(label="step inside one call")]
    return row


def fill_step(row: Row, reply: dict) -> None:
    ours = row.cell("ours")
    inside = row.cells["other"][0]
    ours.samples, inside.samples = reply["new_run"], reply["inside"]
    value = ratio(ours.median(), inside.median())
    row.ratios = f"new run()/inside {fmt_ratio(value)}"
    row.met = "yes" if value is not None and value <= GOAL_STEP_RATIO else "**NO (missed)**"


NOTES = ("Item 12 (persistent ranks on Ray): the two-node Ray cluster of item 9 (two network namespaces "
         "joined by a veth pair, 4 logical CPUs per node, dashboard off), driven from a Jupyter kernel on "
         "node A. `start_ranks(4, cluster=RayCluster(address=HEAD, placement='SPREAD'))` places 2 ranks on "
         "each node, once; a fresh launch is `notebook_launcher(trivial, num_processes=4, cluster=...)` on the "
         "same running cluster (new actors, whose worker processes start and import). ipyparallel: one "
         "ipcontroller in node A's namespace listening on its link, 2 ipengines started in each node's "
         "namespace, `Client(profile_dir=...)[:].apply_sync(trivial)` from the same kernel. DDP step: the "
         "model of item 7 kept in the 4 ranks, whose gradients are all-reduced across the two nodes.")


def main(argv=None) -> int:
    """Run item 12 alone and write its table as a section of RESULTS-ray.md (``run.py --only 12``
    does the same inside the whole table once registered there)."""
    import argparse
    import tempfile

    from .common import machine_description
    from .table import render_table
    parser = argparse.ArgumentParser(prog="python -m benchmarks.persistent_ray")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=os.path.join(REPO_ROOT, "benchmarks", "RESULTS-ray.md"))
    args = parser.parse_args(argv)
    config = {"repeats": args.repeats, "quick": args.quick}
    machine = machine_description()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="nl-bench-ray-persistent-") as log_dir:
        rows = run(config, log_dir, say=lambda text: print(text, flush=True))
    section = ["", "## Item 12: persistent ranks on a Ray cluster", "",
               f"Command: `python -m benchmarks.persistent_ray --repeats {args.repeats}"
               + (" --quick" if args.quick else "") + "`", "",
               "Machine: " + "; ".join(f"{k}: {v}" for k, v in machine.items() if k != "executable"), "",
               render_table(rows), "", "Notes:", "", f"- {NOTES}",
               f"- Each timed cell: median of the samples (min–max, n); {CALLS_PER_REPEAT} call samples and one "
               f"launch per repeat. Whole item: {time.monotonic() - started:.0f} s."]
    if args.quick:
        section.insert(2, "**QUICK MODE: tiny sizes to check the harness; do not quote these numbers.**")
    text = Path(args.out).read_text() if Path(args.out).exists() else ""
    marker = "\n## Item 12: persistent ranks on a Ray cluster"
    if marker in text:
        text = text[:text.index(marker)]
    Path(args.out).write_text(text.rstrip("\n") + "\n" + "\n".join(section) + "\n")
    print("\n".join(section))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
