"""The elastic path's counterpart of ``launcher.run_plan``: the same run state,
display, logs and signal-handler care, around elastic's agent (``elastic.py``).

Elastic's own launcher (``elastic_launch``) installs SIGTERM/SIGINT/SIGHUP/
SIGQUIT handlers through its process context and never restores them; our
agent does not use that context, and we still save and restore every handler
around the run so a notebook kernel gets back exactly what it had.
"""
from __future__ import annotations

from ..display import choose_display
from ..launcher import get_backend, launch_summary, presenting
from ..output import RunLogs
from ..state import RankState, RunState


def run_elastic(plan, job, *, rendezvous, max_restarts, run_id, log_dir, ui, timeout,
                poll_interval, line_prefix):
    """Run ``plan``'s ranks under elastic's agent; return this node's results or raise LaunchError."""
    from .elastic import ElasticRun, describe

    backend = get_backend(plan.start_method)
    backend.prepare_parent()
    logs = RunLogs(run_id, [r.local_rank for r in plan.ranks], [r.global_rank for r in plan.ranks], log_dir)
    state = RunState(run_id=run_id, world_size=plan.world_size, backend=f"{backend.name}+elastic",
                     log_dir=str(logs.path), node_rank=plan.node_rank, num_nodes=plan.num_nodes,
                     max_restarts=max_restarts,
                     ranks=[RankState(rank=r.global_rank, local_rank=r.local_rank, device=r.device)
                            for r in plan.ranks])
    print(launch_summary(plan, state.backend, logs.path) + "\n" + describe(rendezvous, max_restarts),
          flush=True)
    display = choose_display(ui, line_prefix=line_prefix)
    outcome = ("interrupt", None)
    with presenting(state, display, logs):
        run = ElasticRun(plan=plan, job=job, backend=backend, settings=rendezvous,
                         max_restarts=max_restarts, state=state, display=display, logs=logs,
                         poll_interval=poll_interval, timeout=timeout)
        outcome = run.execute()
    kind, value = outcome
    if kind == "results":
        return value
    if kind == "error":
        raise value
    raise KeyboardInterrupt("notebook_launch: the run was interrupted; every rank on this node was stopped")
