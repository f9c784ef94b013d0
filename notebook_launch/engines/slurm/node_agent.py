"""One node's ranks on SLURM: what each node's one ``srun`` step runs
(``python -m notebook_launch.engines.slurm.node_agent``).

Why one step per node rather than one per rank: each rank's own step is a new Python that
imports torch, and DDP's constructor imports torch._dynamo (about 800 modules): on a node's
few cores, N ranks each paying seconds of imports side by side is most of a launch's time
(benchmarks/RESULTS-slurm.md). The agent imports once what the notebook's job will need
(``warm``: module names the notebook chose from the function's code, as the local fork
backend imports before it forks: ``engines.local.warm_imports``), then forks one child per rank of
its node, each of which runs the rank exactly as a rank's own step does (``engines.slurm.task.run_task``:
its streams connect back to the notebook, its signals come over them).

The notebook cannot see a forked rank's wait status, so the agent tells it: one line per rank
on its stdout (srun hands it to the notebook), ``<global rank> exit <code>`` or ``<global rank>
signal <number>``, as each child is reaped. Its own stray output goes to stderr (srun's output
file). The fork happens before any thread of ours exists (the import of torch may leave one of
its own native threads idle, as in a notebook that forks local ranks). Each child dies with the
agent (PR_SET_PDEATHSIG): a step SLURM cancels or kills for its memory takes every rank of it,
and a rank never outlives its agent. This module is the rank side, like ``engines.slurm.task``.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import select
import sys
from typing import Any

from ...rank.bootstrap import die_with_parent
from ...rank.forking import fork_child, reap
from ...rank.preload import EVERY_RANK, warm
from ..remote.assignment import RankAssignment
from .task import run_task

NODE_VARIABLE = "NOTEBOOK_LAUNCH_SLURM_NODE"
SAMPLE_EVERY = 0.02          # seconds between two looks at the ranks' memory (a few microseconds each)
CLEARLY_MORE = 16 * 2**20    # bytes of resident memory one rank must hold over another to be named largest


def main() -> int:
    """Fork the node's ranks, report each one's end, and end once all have (exit code 0)."""
    message = json.loads(os.environ.pop(NODE_VARIABLE))
    report = os.dup(1)   # the ends' channel; fd 1 (inherited by the ranks until they connect) joins stderr
    os.dup2(2, 1)
    warm(message.pop("warm"))
    warm(EVERY_RANK, quiet_if_missing=True)
    node = RankAssignment.from_json(message["rank"])
    agent = os.getpid()
    children: dict[int, int] = {}
    pidfds: dict[int, int] = {}
    for local_rank, rank in enumerate(node.node_ranks()):
        task = dict(message, rank=dataclasses.replace(node, global_rank=rank, local_rank=local_rank).to_json())
        pid, pidfd = fork_child(functools.partial(become_task, agent, task), close=[report, *pidfds])
        children[pid] = rank
        pidfds[pidfd] = pid
    watch(children, pidfds, report)
    return 0


def become_task(agent: int, task: dict[str, Any]) -> None:
    """In the forked child: die with the agent, then run the rank as its own step would."""
    die_with_parent(agent)
    run_task(task)   # never returns


def watch(children: dict[int, int], pidfds: dict[int, int], report: int) -> None:
    """Report each child's end as it is reaped, and which rank holds the most memory whenever that
    changes (``<rank> largest <bytes>``): SLURM kills the whole step when the node's ranks together
    pass the job's memory, and the agent dies with them, so the notebook names the rank that grew
    from the last word it had. Samples every ``SAMPLE_EVERY`` seconds, one pread of each child's
    statm: a rank's last sample before a kill must come after it started to grow."""
    statm = {pid: os.open(f"/proc/{pid}/statm", os.O_RDONLY) for pid in children}
    largest: int | None = None
    page = os.sysconf("SC_PAGE_SIZE")
    while pidfds:
        ready, _, _ = select.select(list(pidfds), [], [], SAMPLE_EVERY)
        for fd in ready:
            pid = pidfds.pop(fd)
            os.close(fd)
            os.close(statm.pop(pid))
            kind, value = reap(pid).status or ("lost", -1)
            os.write(report, f"{children[pid]} {kind} {value}\n".encode())
        sizes = {}
        for pid, fd in statm.items():
            try:
                sizes[pid] = int(os.pread(fd, 100, 0).split()[1]) * page
            except (OSError, IndexError, ValueError):   # ending: its end is reported next
                continue
        if sizes:
            pid = max(sizes, key=sizes.__getitem__)
            if pid != largest and sizes[pid] > min(sizes.values()) + CLEARLY_MORE:
                largest = pid
                os.write(report, f"{children[pid]} largest {sizes[pid]}\n".encode())


if __name__ == "__main__":
    sys.exit(main())
