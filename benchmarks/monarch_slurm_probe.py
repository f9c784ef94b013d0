"""One session of persistent workers on the two-node SLURM, run on node0 (the login node) by
benchmarks/monarch_slurm.py: reserve to the first call, then warm calls, printed as one JSON line.

    .venv/bin/python -m benchmarks.monarch_slurm_probe ours CALLS LOG_DIR
    .venv-monarch/bin/python -m benchmarks.monarch_slurm_probe monarch CALLS LOG_DIR

Each side runs in a fresh interpreter that imported its library before the clock starts; the
Monarch side imports nothing of this project (its venv has only torch and torchmonarch).
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from typing import Any, Callable

NODES = 2
PER_NODE = 2   # ranks (ours) or procs (Monarch) on each node: 4 in all


def job_from_squeue_json(listing: dict, job_id: str) -> dict | None:
    """The job ``job_id`` from ``squeue --json``'s listing, in the layout Monarch 0.7.0's
    ``SlurmJob`` reads. SLURM 22.05 (openapi v0.0.38) differs twice: ``--json`` ignores every
    filter (``--job`` too), so the listing holds every job and the first is not always ours; and
    a job's nodes are ``job_resources.nodes = "node[0-1]"`` (a hostlist string) with the names in
    ``job_resources.allocated_nodes[].nodename``, where SlurmJob reads
    ``job_resources.nodes.allocation[].name``. A listing already in that layout passes unchanged."""
    job = next((entry for entry in listing.get("jobs", []) if str(entry.get("job_id")) == str(job_id)), None)
    resources = (job or {}).get("job_resources") or {}
    if isinstance(resources.get("nodes"), str):
        resources["nodes"] = {"allocation": [{"name": node["nodename"]}
                                             for node in resources.get("allocated_nodes", [])]}
    return job


def slurm_22_05_job(base: type) -> type:
    """Monarch's ``SlurmJob`` with the one method a user on SLURM 22.05 overrides: the job's
    state from ``squeue --json`` (job_from_squeue_json says what differs). Nothing else changes:
    sbatch, the workers' bootstrap, attaching, scancel are Monarch's own."""

    class SlurmJob2205(base):
        def _get_job_info_json(self, job_id: str) -> dict | None:
            listed = subprocess.run(["squeue", "--json"], capture_output=True, text=True, check=True).stdout
            return job_from_squeue_json(json.loads(listed), job_id)

    return SlurmJob2205


def timed(call: Callable[[], Any], calls: int) -> list[float]:
    samples = []
    for _ in range(calls):
        began = time.perf_counter()
        call()
        samples.append(time.perf_counter() - began)
    return samples


def where() -> str:
    return socket.gethostname()


def ours_session(calls: int, log_dir: str) -> dict:
    """``start_ranks(4, cluster=SlurmCluster(nodes=2))`` (salloc, a node agent per node through
    srun, the ranks forked there) to the first ``run(f)``; then warm ``run(f)``. ``f`` is a
    notebook's (``__main__``), as item 15's."""
    from benchmarks.anchors import notebook_function
    from notebook_launch import SlurmCluster, start_ranks
    fn = notebook_function()
    started = time.perf_counter()
    ranks = start_ranks(NODES * PER_NODE, cluster=SlurmCluster(nodes=NODES), ui="none")
    try:
        values = ranks.run(fn)
        to_first = time.perf_counter() - started
        warm = timed(lambda: ranks.run(fn), calls)
        hosts = ranks.run(where)   # untimed: which nodes the ranks ran on
    finally:
        ranks.close()
    return {"start_to_first": to_first, "warm": warm, "values": sorted(values), "hosts": sorted(set(hosts))}


def monarch_session(calls: int, log_dir: str) -> dict:
    """Monarch 0.7.0's ``SlurmJob`` (sbatch of one worker per node, ``squeue --json`` until it
    runs, ``attach_to_workers``), then ``spawn_procs(per_host={"procs": 2})``, an actor on each
    proc and its first ``call().get()``; then warm calls of the same trivial endpoint."""
    from monarch.actor import Actor, current_rank, endpoint
    from monarch.job import SlurmJob

    class Trivial(Actor):
        @endpoint
        def rank(self) -> int:
            return int(current_rank().rank)

        @endpoint
        def host(self) -> str:
            return socket.gethostname()

    started = time.perf_counter()
    job = slurm_22_05_job(SlurmJob)(meshes={"workers": NODES}, python_exe=sys.executable, log_dir=log_dir,
                                    job_name="monarch_bench")
    try:
        job.apply()
        state = job.state(cached_path=None)
        attached = time.perf_counter() - started
        procs = state.workers.spawn_procs(per_host={"procs": PER_NODE})
        actors = procs.spawn("trivial", Trivial)
        values = [value for _, value in actors.rank.call().get().items()]
        to_first = time.perf_counter() - started
        warm = timed(lambda: actors.rank.call().get(), calls)
        hosts = [value for _, value in actors.host.call().get().items()]
    finally:
        job.kill()
    return {"start_to_first": to_first, "attached": attached, "warm": warm, "values": sorted(values),
            "hosts": sorted(set(hosts))}


def main(argv: list[str]) -> None:
    side, calls, log_dir = argv[0], int(argv[1]), argv[2]
    devnull = os.open(os.devnull, os.O_WRONLY)
    reply = os.dup(1)
    os.dup2(devnull, 1)   # what the libraries print goes nowhere; the reply is the one line on the real stdout
    if side == "ours":
        out = ours_session(calls, log_dir)
    elif side == "monarch":
        out = monarch_session(calls, log_dir)
    else:
        raise SystemExit(f"monarch_slurm_probe: unknown side {side!r}")
    os.write(reply, (json.dumps(out) + "\n").encode())
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)   # Monarch's Rust runtime stops with the process


if __name__ == "__main__":
    main(sys.argv[1:])
