"""Issue 33 item 6: one cell on a SLURM cluster, side by side with submitit on the same cluster.

On a real two-node SLURM 22.05 (slurmctld and two slurmd, each node in its own network and UTS
namespace: tests/slurmcluster/slurm_two_nodes.py, the test fixture's cluster), driven from one
"notebook" Python process on node0 (the login node), in an order that rotates every repeat:

- call to the first trained DDP step and call to results, 4 ranks over 2 nodes: this project's
  ``notebook_launcher(fn, num_processes=4, cluster=SlurmCluster(nodes=2))`` against submitit's
  ``AutoExecutor`` (``nodes=2, tasks_per_node=2``) whose function calls
  ``submitit.helpers.TorchDistributedEnvironment().export()`` before ``init_process_group``;
- a rank that fails after the group is up (rank 2 raises, the others go on to a collective):
  call to the error in the notebook, and whether that error is the failing rank's own;
- a warm call on persistent ranks on the held allocation: ``start_ranks(4, cluster=SlurmCluster(nodes=2))``
  once, an untimed call, then ``ranks.run(trivial)`` timed call to results, against the goal (10 ms) and a
  launch's call to results.

    python -m benchmarks.slurm_cluster --repeats 5      # writes benchmarks/RESULTS-slurm.md

Needs root, iproute2, Debian's slurm-wlm and munge, and submitit (the test extra); otherwise the
rows say why they are missing.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

from .common import REPO_ROOT, version_of
from .table import Cell, Row, fmt_ratio, ratio

sys.path.insert(0, os.path.join(REPO_ROOT, "tests", "slurmcluster"))

RANKS = 4
NODES = 2
GOAL_FIRST_STEP = 2.0
GOAL_WARM_CALL_S = 0.010
WARM_CALLS_PER_REPEAT = 20   # timed warm calls on the persistent ranks, per repeat
FAILURE_CAP_S = 120.0   # how long the notebook waits for submitit to report the failed job
NOTEBOOK_TIMEOUT_S = 3000.0

# The notebook on node0: its definitions, then one sample per printed "SAMPLE {json}" line, so
# samples taken before a timeout still count.
NOTEBOOK = """
import json, os, subprocess, sys, threading, time
import torch
import submitit
from notebook_launch import notebook_launcher, start_ranks, SlurmCluster

FOLDER = {folder!r}

def first_step(with_submitit):
    import time
    started = time.time()
    import torch, torch.distributed as dist
    imported = time.time()
    if with_submitit:
        import submitit
        submitit.helpers.TorchDistributedEnvironment().export()
    dist.init_process_group("gloo")
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 1))
    model(torch.ones(4, 16)).sum().backward()
    return started, imported, time.time()

def fails_on_rank_two(with_submitit):
    import os, torch, torch.distributed as dist
    if with_submitit:
        import submitit
        submitit.helpers.TorchDistributedEnvironment().export()
    dist.init_process_group("gloo")
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 1))
    model(torch.ones(4, 16)).sum().backward()
    if os.environ["RANK"] == "2":
        raise ValueError("rank two gives up")
    model(torch.ones(4, 16)).sum().backward()   # the next step's all-reduce waits for rank 2
    return True

def executor():
    ex = submitit.AutoExecutor(folder=os.path.join(FOLDER, "%j"), cluster="slurm")
    ex.update_parameters(nodes={nodes}, tasks_per_node={per_node}, cpus_per_task=1, timeout_min=10)
    return ex

def queue_empty():
    # untimed, between samples: the last job has left the nodes, so every sample starts on idle nodes
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        listed = subprocess.run(["squeue", "-h", "-o", "%i %T"], capture_output=True, text=True).stdout.split()
        if not listed:
            return
        time.sleep(0.2)
    raise RuntimeError(f"jobs still queued: {{listed}}")

def ours(fn):
    t0 = time.time()
    out = notebook_launcher(fn, args=(False,), num_processes={ranks}, cluster=SlurmCluster(nodes={nodes}), ui="none")
    return t0, out, time.time()

def theirs(fn):
    t0 = time.time()
    job = executor().submit(fn, True)
    out = job.results()
    return t0, out, time.time()

def sample(name, **values):
    print("SAMPLE " + json.dumps(dict(name=name, **values)), flush=True)

def failure(name):
    t0 = time.time()
    holder = {{}}
    def call():
        try:
            if name == "ours":
                notebook_launcher(fails_on_rank_two, args=(False,), num_processes={ranks},
                                  cluster=SlurmCluster(nodes={nodes}), ui="none")
            else:
                holder["job"] = executor().submit(fails_on_rank_two, True)
                holder["job"].results()
            holder["error"] = None
        except Exception as exc:
            holder["error"] = f"{{type(exc).__name__}}: {{exc}}"
        holder["t"] = time.time()
    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join({cap})
    if thread.is_alive():   # no answer within the cap: end the job and say so
        if "job" in holder:
            holder["job"].cancel(check=False)
        sample(name, kind="failure", seconds=None, own_error=False, error="no error within {cap:g} s")
        return
    error = holder["error"] or "no error"
    sample(name, kind="failure", seconds=holder["t"] - t0, own_error="rank two gives up" in error,
           error=error[-4000:])

def trivial():
    return int(os.environ["RANK"])

def persistent():
    # persistent ranks on the held allocation: started once (untimed), one untimed call, then warm calls
    try:
        ranks = start_ranks({ranks}, cluster=SlurmCluster(nodes={nodes}), ui="none")
    except Exception as exc:
        sample("ours", kind="persistent", seconds=None, error=f"{{type(exc).__name__}}: {{str(exc).splitlines()[0]}}")
        return
    try:
        ranks.run(trivial)
        for _ in range({warm_calls}):
            t0 = time.perf_counter()
            ranks.run(trivial)
            sample("ours", kind="persistent", seconds=time.perf_counter() - t0, error=None)
    finally:
        ranks.close()

for warm in ("ours", "submitit"):   # untimed: the first srun/sbatch of the session, file caches
    queue_empty()
    (ours if warm == "ours" else theirs)(first_step)
for repeat in range({repeats}):
    order = ["ours", "submitit"][repeat % 2:] + ["ours", "submitit"][:repeat % 2]
    for name in order:
        queue_empty()
        t0, steps, returned = (ours if name == "ours" else theirs)(first_step)
        sample(name, kind="launch", started=max(s[0] for s in steps) - t0, imported=max(s[1] for s in steps) - t0,
               first_step=max(s[2] for s in steps) - t0, results=returned - t0)
for repeat in range({failure_repeats}):
    for name in (["ours", "submitit"] if repeat % 2 == 0 else ["submitit", "ours"]):
        queue_empty()
        failure(name)
queue_empty()
persistent()
queue_empty()
print("DONE", flush=True)
"""


def run(config: dict, log_dir: str, say: Callable[[str], Any] = print) -> list[Row]:
    rows = [started_row(), imported_row(), first_step_row(), results_row(), failure_row(), persistent_row()]
    reason = unavailable_reason()
    if reason:
        for row in rows:
            row.cell("ours").text = f"not measured: {reason}"
        return rows
    from slurm_two_nodes import SlurmTwoNodes
    cluster = SlurmTwoNodes(Path(log_dir))
    hosts = name_resolution(cluster)
    try:
        say("SLURM benchmark: starting a two-node SLURM cluster")
        cluster.up()
        repeats = config["repeats"]
        failure_repeats = 1 if config["quick"] else max(1, min(3, repeats))
        code = NOTEBOOK.format(folder=str(Path(log_dir) / "submitit"), nodes=NODES, per_node=RANKS // NODES,
                               ranks=RANKS, repeats=repeats, failure_repeats=failure_repeats, cap=FAILURE_CAP_S,
                               warm_calls=WARM_CALLS_PER_REPEAT * repeats)
        samples = run_notebook(cluster, code, say)
        config["beside"] = sum(1 for entry in samples if entry.get("beside"))
        config["samples"] = len(samples)
        fill(rows, samples)
    except Exception as exc:   # one failure must not lose the rows measured so far
        say(f"SLURM benchmark failed: {exc}")
        for row in rows:
            if not row.cell("ours").samples:
                row.cell("ours").text = f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    finally:
        cluster.down()
        for folder in hosts:
            shutil.rmtree(folder, ignore_errors=True)
    return rows


def unavailable_reason() -> str | None:
    try:
        import submitit  # noqa: F401
    except ImportError:
        return "needs submitit (pip install -e '.[test]')"
    from slurm_two_nodes import unavailable_reason as cluster_unavailable
    return cluster_unavailable()


def name_resolution(cluster: Any) -> list[Path]:
    """Node names that resolve inside both namespaces, as a real cluster's do: ``ip netns exec``
    (which starts every daemon, so every job step) mounts /etc/netns/<namespace>/hosts over
    /etc/hosts. submitit's TorchDistributedEnvironment sets MASTER_ADDR to the first node's *name*;
    this project sets its address. The machine's own /etc/hosts is left alone."""
    from slurm_two_nodes import NODES as NAMES
    lines = "127.0.0.1 localhost\n" + "".join(f"{addr} {name}\n" for addr, name in zip(cluster.addresses, NAMES))
    folders = []
    for namespace in cluster.namespaces:
        folder = Path("/etc/netns") / namespace
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "hosts").write_text(lines)
        folders.append(folder)
    return folders


def run_notebook(cluster: Any, code: str, say: Callable[[str], Any]) -> list[dict]:
    """The notebook on node0, its stderr into a file (submitit warns on every sacct call it makes,
    and a pipe no one drains would stop it)."""
    script = Path(cluster.tmp) / "notebook.py"
    script.write_text(code)
    errors = Path(cluster.tmp) / "notebook.err"
    with open(errors, "w") as err:
        proc = subprocess.Popen(cluster.netns_argv(0, sys.executable, str(script)), env=cluster.env, text=True,
                                stdout=subprocess.PIPE, stderr=err, cwd=str(cluster.tmp))
    samples: list[dict] = []
    deadline = time.monotonic() + NOTEBOOK_TIMEOUT_S
    try:
        assert proc.stdout is not None  # a pipe, as asked
        for line in proc.stdout:
            if line.startswith("SAMPLE "):
                samples.append(json.loads(line[len("SAMPLE "):]))
                samples[-1]["beside"] = other_clusters(cluster)
                say(f"SLURM benchmark: {samples[-1]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the notebook ran over {NOTEBOOK_TIMEOUT_S:.0f} s")
        proc.wait(timeout=60)
        if proc.returncode != 0:
            raise RuntimeError(f"the notebook failed ({proc.returncode}): {errors.read_text()[-2000:]}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return samples


def started_row() -> Row:
    row = Row("33.6", "SLURM: call to the function's first line on every rank (4 ranks, 2 nodes; ours' ranks "
              "have imported torch by then, submitit's have not)", str(RANKS), "s", group=33,
              goal="— (where the time goes)")
    row.cells["other"] = [Cell(label="submitit AutoExecutor")]
    return row


def imported_row() -> Row:
    row = Row("33.6", "SLURM: call to `import torch, torch.distributed` done in the function on every rank "
              "(4 ranks, 2 nodes)", str(RANKS), "s", group=33, goal="— (where the time goes)")
    row.cells["other"] = [Cell(label="submitit AutoExecutor")]
    return row


def other_clusters(cluster: Any) -> list[str]:
    """Namespaces of another session's test SLURM (tests/slurmcluster) on this machine right now:
    their daemons and ranks share the CPUs with this benchmark's, which the notes then say."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    return [name for name in listed if name.startswith("nlslurm-") and name not in cluster.namespaces]


def first_step_row() -> Row:
    row = Row("33.6", "SLURM: call to first trained DDP step (4 ranks, 2 nodes)", str(RANKS), "s", group=33,
              goal=f"≥{GOAL_FIRST_STEP:g}x faster than submitit")
    row.cells["other"] = [Cell(label="submitit AutoExecutor + TorchDistributedEnvironment")]
    return row


def results_row() -> Row:
    row = Row("33.6", "SLURM: call to results in the notebook (4 ranks, 2 nodes)", str(RANKS), "s", group=33,
              goal="— (no goal)")
    row.cells["other"] = [Cell(label="submitit `job.results()`")]
    return row


def failure_row() -> Row:
    row = Row("33.6", "SLURM: rank 2 raises after the first step, the others wait in the next all-reduce: "
              "call to the error in the notebook (4 ranks, 2 nodes)", str(RANKS), "s", group=33,
              goal="— (behaviour: whose error is shown)")
    row.cells["other"] = [Cell(label="submitit `job.results()`")]
    return row


def persistent_row() -> Row:
    row = Row("33.6", "SLURM: a warm call on persistent ranks on the held allocation "
              "(`start_ranks(4, cluster=SlurmCluster(nodes=2))`, then `ranks.run(trivial)`: call to results)",
              str(RANKS), "s", group=33, goal=f"warm call within {GOAL_WARM_CALL_S * 1000:g} ms")
    row.cells["other"] = [Cell(label="a launch's call to results (row above)")]
    return row


def fill(rows: list[Row], samples: list[dict]) -> None:
    started, imported, first, results, failure, persistent = rows
    for entry in samples:
        theirs = entry["name"] == "submitit"
        if entry["kind"] == "launch":
            (started.cells["other"][0] if theirs else started.cell("ours")).samples.append(entry["started"])
            (imported.cells["other"][0] if theirs else imported.cell("ours")).samples.append(entry["imported"])
            (first.cells["other"][0] if theirs else first.cell("ours")).samples.append(entry["first_step"])
            (results.cells["other"][0] if theirs else results.cell("ours")).samples.append(entry["results"])
    speedup = ratio(first.cells["other"][0].median(), first.median("ours"))
    first.ratios = f"submitit/ours {fmt_ratio(speedup)}"
    first.met = "n/a" if speedup is None else ("yes" if speedup >= GOAL_FIRST_STEP else "**NO (missed)**")
    for row in (started, imported):
        row.ratios = f"submitit/ours {fmt_ratio(ratio(row.cells['other'][0].median(), row.median('ours')))}"
    results.ratios = f"submitit/ours {fmt_ratio(ratio(results.cells['other'][0].median(), results.median('ours')))}"
    fill_failure(failure, [s for s in samples if s["kind"] == "failure"])
    fill_persistent(persistent, [s for s in samples if s["kind"] == "persistent"], results.median("ours"))


def fill_persistent(row: Row, samples: list[dict], launch: float | None) -> None:
    """The warm calls' times, against the goal and against a launch's call to results."""
    ours = row.cell("ours")
    ours.samples = [s["seconds"] for s in samples if s["seconds"] is not None]
    if launch is not None:
        row.cells["other"][0].samples = [launch]
    failed = [s["error"] for s in samples if s["error"]]
    if failed and not ours.samples:
        ours.text = f"error: {failed[0][:160]}"
    median = ours.median() if ours.samples else None
    row.ratios = f"launch/warm call {fmt_ratio(ratio(launch, median))}"
    row.met = "n/a" if median is None else ("yes" if median <= GOAL_WARM_CALL_S else "**NO (missed)**")


def fill_failure(row: Row, samples: list[dict]) -> None:
    """Timed samples where an error came back; the text says whose error each side showed."""
    cells = {"ours": row.cell("ours"), "submitit": row.cells["other"][0]}
    said = {}
    for name, cell in cells.items():
        mine = [s for s in samples if s["name"] == name]
        cell.samples = [s["seconds"] for s in mine if s["seconds"] is not None]
        own = sum(1 for s in mine if s["own_error"])
        said[name] = (f"{own} of {len(mine)} showed rank 2's ValueError"
                      + ("" if own == len(mine) else f"; it showed: {first_other_error(mine)}"))
        if not cell.samples and mine:
            cell.text = mine[0]["error"]
    row.ratios = (f"submitit/ours {fmt_ratio(ratio(cells['submitit'].median(), cells['ours'].median()))}; "
                  f"ours: {said.get('ours', '—')}; submitit: {said.get('submitit', '—')}")


def first_other_error(samples: list[dict]) -> str:
    """The error's type and the last exception line of the trace it carries (the cause it names)."""
    for entry in samples:
        if not entry["own_error"]:
            lines = [line.strip() for line in entry["error"].splitlines() if line.strip()]
            causes = [line for line in lines if re.match(r"^[\w.]+(Error|Exception)\b.*:", line)]
            text = lines[0].split(":")[0] + (f" carrying `{causes[-1][:200]}`" if causes else "")
            return text.replace("|", "/")
    return "—"


def notes(repeats: int, failure_repeats: int) -> str:
    return (
        "A real two-node SLURM 22.05 on this machine (the test fixture's cluster, tests/slurmcluster/"
        "slurm_two_nodes.py: slurmctld and two slurmd with 2 CPUs each, each node in its own network and UTS "
        "namespace, sched_interval=1, no accounting), driven from one Python process on node0 (the login "
        "node) that imported torch, submitit and notebook_launch before any timing. The node names resolve "
        "inside both namespaces (/etc/netns/<namespace>/hosts, as a cluster's DNS would): submitit's "
        "TorchDistributedEnvironment sets MASTER_ADDR to the first node's name. Every sample is a new job "
        "on idle nodes (the notebook waits untimed until the queue is empty); one untimed call of each "
        "first; ours then submitit, the order swapped every repeat. "
        "This project: `notebook_launcher(fn, num_processes=4, cluster=SlurmCluster(nodes=2), ui='none')` "
        "(salloc, then one srun step per node, whose agent imports torch and DDP's modules once and forks "
        "the node's ranks; results over TCP). submitit "
        f"{version_of('submitit')}: `AutoExecutor(folder, cluster='slurm')` with `nodes=2, tasks_per_node=2, "
        "cpus_per_task=1, timeout_min=10`, `submit(fn)`, `job.results()` (sbatch, one srun of 4 tasks; "
        "results as pickles in the shared folder, which `results()` looks for once a second); the function "
        "calls `submitit.helpers.TorchDistributedEnvironment().export()` then `init_process_group('gloo')`. "
        "Each rank returns `time.time()` at its function's first line, after `import torch, "
        "torch.distributed` (the function's second line) and after its first DDP forward/backward; each "
        "column is the last rank's minus the call's start. "
        f"{repeats} launch samples and {failure_repeats} failure samples per side. Failure: the error the "
        f"notebook's call raised, or none within {FAILURE_CAP_S:g} s (then the job is cancelled). The "
        f"persistent row: `start_ranks(4, cluster=SlurmCluster(nodes=2), ui='none')` held once (untimed), one "
        f"untimed call, then {WARM_CALLS_PER_REPEAT} timed `ranks.run(trivial)` per repeat (call to results over "
        "the ranks' TCP connections: no salloc, no srun), after every launch sample, then `close()`.")


def main(argv: list[str] | None = None) -> int:
    """Run the SLURM rows alone and write benchmarks/RESULTS-slurm.md."""
    from .alone import run_alone, write_page
    done = run_alone("benchmarks.slurm_cluster", os.path.join(REPO_ROOT, "benchmarks", "RESULTS-slurm.md"),
                     "one failure sample: checks the harness", run, argv)
    config = done.config
    failure_repeats = 1 if done.args.quick else max(1, min(3, done.args.repeats))
    beside = ([f"Another session's test SLURM cluster (tests/slurmcluster) was running on this machine when "
               f"{config['beside']} of the {config['samples']} samples ended: its daemons and ranks shared the "
               "2 cores with these."] if config.get("beside") else [])
    return write_page(done, "notebook_launch on SLURM, beside submitit (issue 33 item 6)", done.command,
                      f"; submitit: {version_of('submitit')}", [notes(done.args.repeats, failure_repeats), *beside])


if __name__ == "__main__":
    raise SystemExit(main())
