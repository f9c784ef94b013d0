"""Item 15 on SLURM (issue 45 item 3): Meta's Monarch ``SlurmJob`` beside our ``SlurmCluster``
persistent ranks, on the tests' real two-node SLURM 22.05 (tests/slurmcluster/slurm_two_nodes.py:
slurmctld and two slurmd, each node in its own network and UTS namespace).

Each session is a fresh "notebook" process on node0 (the login node), ours then Monarch's with the
order swapped every repeat, the queue empty and both nodes idle before each (untimed); one untimed
session of each first. A session holds 4 workers over the 2 nodes (2 a node) and gives one
reserve-to-first-call sample and CALLS warm trivial calls (benchmarks/monarch_slurm_probe.py):

- ours: ``start_ranks(4, cluster=SlurmCluster(nodes=2))`` then ``ranks.run(f)``;
- Monarch 0.7.0: ``SlurmJob(meshes={"workers": 2}).apply()``, ``state()``,
  ``spawn_procs(per_host={"procs": 2})``, an actor on each proc, ``actors.rank.call().get()``.

    python -m benchmarks.monarch_slurm --repeats 5     # writes benchmarks/RESULTS-anchors-slurm.md

Needs root, iproute2, Debian's slurm-wlm and munge, and ``.venv-monarch``
(``bash scripts/setup-anchors.sh monarch``); otherwise the rows say why they are missing.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

from .anchors import percentile, spread, venv_python
from .common import REPO_ROOT
from .table import Cell, Row, fmt_ratio, ratio

sys.path.insert(0, os.path.join(REPO_ROOT, "tests", "slurmcluster"))

CALLS = 100
QUICK_CALLS = 20
WARMUP_CALLS = 5
SESSION_TIMEOUT_S = 300.0
SIDES = ("ours", "monarch")
WORKERS = 4   # 2 nodes x 2 ranks (ours) or procs (Monarch)


def run(config: dict, log_dir: str, say: Callable[[str], Any] = print) -> list[Row]:
    """The two rows, measured on a two-node SLURM started here and always torn down."""
    found: dict = {side: {"start": [], "warm": [], "attached": [], "hosts": set()} for side in SIDES}
    errors: dict = {}
    reason = unavailable_reason()
    if reason:
        errors = {side: f"not measured: {reason}" for side in SIDES}
        return [start_row(found, errors), call_row(found, errors)]
    from slurm_two_nodes import SlurmTwoNodes

    from .slurm_cluster import name_resolution
    cluster = SlurmTwoNodes(Path(log_dir))
    hosts = name_resolution(cluster)
    try:
        say("Monarch on SLURM: starting a two-node SLURM cluster")
        cluster.up()
        sessions(cluster, config, log_dir, found, errors, say)
    except Exception as exc:   # one failure must not lose the samples taken so far
        say(f"Monarch on SLURM failed: {exc}")
        for side in SIDES:
            errors.setdefault(side, f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
    finally:
        cluster.down()
        for folder in hosts:
            shutil.rmtree(folder, ignore_errors=True)
    return [start_row(found, errors), call_row(found, errors)]


def unavailable_reason() -> str | None:
    if venv_python("monarch") is None:
        return "needs .venv-monarch (bash scripts/setup-anchors.sh monarch)"
    from slurm_two_nodes import unavailable_reason as cluster_unavailable
    return cluster_unavailable()


def sessions(cluster: Any, config: dict, log_dir: str, found: dict, errors: dict,
             say: Callable[[str], Any]) -> None:
    """One untimed session of each, then ``repeats`` of each in a rotating order; a side that
    fails stops there (its error goes in its cells), the other goes on."""
    calls = QUICK_CALLS if config["quick"] else CALLS
    plan = [(side, WARMUP_CALLS, False) for side in SIDES]
    for repeat in range(config["repeats"]):
        plan += [(side, calls, True) for side in (SIDES if repeat % 2 == 0 else SIDES[::-1])]
    for side, count, kept in plan:
        if side in errors:
            continue
        cluster.ensure_up()   # untimed: no job of the last session left, both nodes idle
        try:
            reply = session(cluster, side, count, log_dir)
            check(side, reply)
        except (OSError, RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
            errors[side] = f"error: {type(exc).__name__}: {exc}"[:400]
            say(f"Monarch on SLURM: {side} failed: {errors[side]}")
            continue
        say(f"Monarch on SLURM: {side}{'' if kept else ' (untimed)'}: reserve to first call "
            f"{reply['start_to_first']:.2f} s, warm median {percentile(reply['warm'], 0.5) * 1000:.2f} ms, "
            f"on {reply['hosts']}")
        if kept:
            found[side]["start"].append(reply["start_to_first"])
            found[side]["warm"] += reply["warm"]
            found[side]["attached"] += [reply["attached"]] if "attached" in reply else []
            found[side]["hosts"].update(reply["hosts"])


def session(cluster: Any, side: str, calls: int, log_dir: str) -> dict:
    """One probe on node0 with node0's hostname (Monarch's workers dial the client back by the
    name it advertises: ChannelTransport.TcpWithHostname), its stderr into a file."""
    python = sys.executable if side == "ours" else venv_python("monarch")
    folder = Path(log_dir) / side
    folder.mkdir(exist_ok=True)
    argv = cluster.netns_argv(0, "unshare", "--uts", "sh", "-c", 'hostname node0 && exec "$@"', "sh",
                              str(python), "-m", "benchmarks.monarch_slurm_probe", side, str(calls), str(folder))
    with open(folder / "probe.stderr", "ab") as errors:
        done = subprocess.run(argv, env=cluster.env, cwd=str(folder), stdout=subprocess.PIPE, stderr=errors,
                              timeout=SESSION_TIMEOUT_S)
    lines = done.stdout.decode(errors="replace").strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (folder / "probe.stderr").read_text(errors="replace").strip().splitlines()[-1:] or ["(no stderr)"]
        raise RuntimeError(f"{side} probe exited {done.returncode}: {tail[0][:300]}")
    return json.loads(lines[-1])


def check(side: str, reply: dict) -> None:
    """Every worker answered, from both nodes: else the samples are not of the same thing."""
    if reply["values"] != list(range(WORKERS)) or reply["hosts"] != ["node0", "node1"]:
        raise ValueError(f"{side}: workers answered {reply['values']} from {reply['hosts']}, "
                         f"not ranks 0-{WORKERS - 1} on node0 and node1")


def cells(row: Row, found: dict, errors: dict, key: str) -> tuple[Cell, Cell]:
    ours, monarch = row.cell("ours"), Cell(label="Monarch SlurmJob")
    row.cells["other"] = [monarch]
    for cell, side in ((ours, "ours"), (monarch, "monarch")):
        cell.samples = found[side][key]
        if side in errors:
            cell.text = errors[side]
    return ours, monarch


def start_row(found: dict, errors: dict) -> Row:
    row = Row(item="15", measurement="SLURM, 2 nodes: reserve to the first call on 4 persistent workers "
              "(2 a node; imports done): `start_ranks(4, cluster=SlurmCluster(nodes=2))` + `run(f)` vs Monarch "
              "0.7.0 `SlurmJob(meshes={'workers': 2})` `apply()` + `state()` + `spawn_procs(per_host={'procs': 2})` "
              "+ `spawn` + `call().get()`", ranks=str(WORKERS), unit="s", group=15,
              goal="— (issue 45 item 3: measured side by side)")
    ours, monarch = cells(row, found, errors, "start")
    attached = found["monarch"]["attached"]
    row.ratios = (f"ours/Monarch {fmt_ratio(ratio(ours.median(), monarch.median()))}"
                  + (f"; Monarch's `apply()` + `state()` alone (sbatch, squeue every 2 s until it runs, attach): "
                     f"median {percentile(attached, 0.5):.2f} s" if attached else ""))
    return row


def call_row(found: dict, errors: dict) -> Row:
    row = Row(item="15", measurement="SLURM, 2 nodes: warm trivial call on 4 persistent workers across the "
              "nodes, the function a notebook's (`__main__`): `ranks.run(f)` vs Monarch 0.7.0 "
              "`actors.rank.call().get()` (an actor on each of 4 procs)", ranks=str(WORKERS), unit="s", group=15,
              goal="— (issue 45 item 3: measured side by side)")
    ours, monarch = cells(row, found, errors, "warm")
    if ours.samples and monarch.samples:
        row.ratios = (f"ours/Monarch {fmt_ratio(ratio(ours.median(), monarch.median()))}; "
                      f"ours p90/median {fmt_ratio(ratio(percentile(ours.samples, 0.9), ours.median()))}; "
                      f"ours {spread(ours.samples)}; Monarch {spread(monarch.samples)}")
    return row


def monarch_version() -> str:
    python = venv_python("monarch")
    if python is None:
        return "missing"
    done = subprocess.run([python, "-c", "from importlib import metadata; print(metadata.version('torchmonarch'))"],
                          capture_output=True, text=True, timeout=60)
    return done.stdout.strip() or "unknown"


def notes(repeats: int, calls: int) -> list[str]:
    return [
        "A real two-node SLURM 22.05 on this machine (the test fixture's cluster, tests/slurmcluster/"
        "slurm_two_nodes.py: slurmctld and two slurmd with 2 CPUs each, each node in its own network and UTS "
        "namespace, sched_interval=1, no accounting). Each session is a fresh Python on node0 (the login node, "
        "with node0's hostname) that imported its library first: ours from `.venv`, Monarch's from "
        "`.venv-monarch` (torchmonarch 0.7.0 beside torch 2.13; the nodes run the same interpreter: they share "
        "the file system). The node names resolve in both namespaces (/etc/netns/<namespace>/hosts, as a "
        "cluster's DNS would). Before each session the queue is empty and both nodes idle (untimed); one "
        "untimed session of each first, then ours and Monarch's in turn, the order swapped every repeat. "
        f"{repeats} sessions a side, each one reserve-to-first-call sample and {calls} warm calls "
        "(benchmarks/monarch_slurm_probe.py). A session checks that ranks 0-3 answered from node0 and node1.",
        "Ours: `start_ranks(4, cluster=SlurmCluster(nodes=2), ui='none')` (salloc, one srun step per node "
        "whose agent forks the node's 2 ranks; calls over the ranks' TCP connections), then `ranks.run(f)` "
        "with `f` a notebook's function (`__main__`, as item 15's). Monarch: `SlurmJob(meshes={'workers': 2}, "
        "python_exe=<.venv-monarch's python>)` with its defaults (`--exclusive`, one task a node): `apply()` "
        "submits an sbatch whose `srun` starts one Monarch worker a node on port 22222; `state()` polls "
        "`squeue --json` every 2 s until the job runs and attaches to the workers; then "
        "`spawn_procs(per_host={'procs': 2})`, an actor on each of the 4 procs, `actors.rank.call().get()` "
        "(every proc's value back, as `ranks.run`). `kill()` (scancel) ends each session.",
        "Monarch 0.7.0's `SlurmJob` does not run as shipped on SLURM 22.05; the benchmark runs it with the "
        "one override a user there would write (`monarch_slurm_probe.slurm_22_05_job`: its "
        "`_get_job_info_json` reads `squeue --json` itself). Two things differ in 22.05's JSON (openapi "
        "v0.0.38): `squeue --json` ignores every filter, `--job` included (its man page: 'All other formatting "
        "and filtering arguments will be ignored'), so `SlurmJob` takes the first job listed as its own and, "
        "with an earlier job still listed, stops with `RuntimeError: SLURM job is no longer active` (it read "
        "that job's CANCELLED); and a job's nodes are `job_resources.nodes = \"node[0-1]\"` (a hostlist "
        "string, the names in `job_resources.allocated_nodes[].nodename`), where `SlurmJob` reads "
        "`job_resources.nodes.allocation[].name`: `AttributeError: 'str' object has no attribute 'get'` in "
        "`_wait_for_job_start`, after which it cancels the job. One more condition, of the setup rather than "
        "the version: Monarch's client advertises its hostname (`ChannelTransport.TcpWithHostname`), which must "
        "resolve on the nodes; a client whose hostname does not resolve there stops with a Rust panic "
        "('failed to resolve hostname'), so the notebook runs with node0's name, as a login node's resolves.",
    ]


def main(argv: list[str] | None = None) -> int:
    """Run the two rows alone and write benchmarks/RESULTS-anchors-slurm.md."""
    from .alone import run_alone, write_page
    done = run_alone("benchmarks.monarch_slurm", os.path.join(REPO_ROOT, "benchmarks", "RESULTS-anchors-slurm.md"),
                     f"{QUICK_CALLS} warm calls a session: checks the harness", run, argv)
    calls = QUICK_CALLS if done.args.quick else CALLS
    return write_page(done, "Monarch's SlurmJob beside our SlurmCluster persistent ranks (issue 45 item 3)",
                      f"bash scripts/setup-anchors.sh monarch && {done.command}",
                      f"; torchmonarch (.venv-monarch): {monarch_version()}", notes(done.args.repeats, calls))


if __name__ == "__main__":
    raise SystemExit(main())
