"""A rank on a SLURM node: what each rank the node's agent forks runs (``run_task``; the agent is
``engines.slurm.node_agent``, one ``srun`` step per node).

It connects the rank's four streams back to the notebook (``channels.sockets``, as a Ray rank
does), points fds 1/2 and the event channel at them, builds the same environment a local rank
gets (``plan.rank_environment``, with the interface that reaches rank 0's node), loads the
cloudpickled job the notebook wrote into the run folder and runs it with ``rank.runner.run_rank``:
from there on it is a local rank, but for its resources, which it samples itself
(``rank.reports.resources``: the notebook cannot read this node's /proc). A thread delivers the signals
the notebook sends over the events connection (Stop, timeout, another rank failed) and ends the
rank if the notebook goes away, and answers its where requests. A persistent rank
(``engines.slurm.persistent``: the assignment says ``persistent``) reads the notebook's messages
instead (``engines.remote.serve.listen``: calls, interrupts, STOP, where requests) and its job is the
serving loop every persistent rank on another machine runs, a Ray actor's too
(``engines.remote.serve.serve_ray_calls``). This module is the rank side: it
imports only what a rank imports (rank/, channels, protocol, plan, net), never the notebook side
of the SLURM engine.
"""
from __future__ import annotations

import os
import threading
from typing import Any

from ...wire import protocol
from ...channels.sockets import connect_streams
from ...rank.bootstrap import EXIT_FAILED, capture_output, exit_with
from ..remote.serve import listen
from ...rank.reports.remote_where import Answerer, obey_notebook
from ...rank.reports.resources import report_own
from ...rank.runner import report_error, run_rank, setup_failure
from ...rank.spawn_entry import load_remote_job
from ...rank.group.store_wait import wait_for_store_before_rendezvous
from ..remote.assignment import RankAssignment

def run_task(message: dict[str, Any]) -> None:
    """The rank's whole life, in this process (its own ``srun`` step, or a child the node's agent
    forked: ``engines.slurm.node_agent``; ``message``: where to connect, the job's file and the rank's
    ``RankAssignment``). Never returns: the process ends with the rank's exit code."""
    assignment = RankAssignment.from_json(message["rank"]).toward_master()
    payload = message["payload"]
    socks = connect_streams(message["host"], message["port"], bytes.fromhex(message["token"]),
                            assignment.global_rank)

    finished = threading.Event()   # set once the rank's job returned (a persistent rank: after STOP)

    def body() -> int:
        capture_output(os.dup(socks[1].fileno()), os.dup(socks[2].fileno()))
        socks[1].close()
        socks[2].close()
        writer = protocol.EventWriter(socks[0].fileno(), answers_fd=socks[3].fileno())
        protocol.install(writer)
        if assignment.persistent:   # calls come on the events connection, as to a Ray actor
            listen(socks[0], finished, socks[3])
        else:
            threading.Thread(target=obey_notebook, args=(socks[0], Answerer(socks[3])), daemon=True,
                             name="notebook_launch-control").start()
        spec = assignment.spec(os.environ)
        os.environ.update(spec.env)
        try:
            with open(payload, "rb") as f:
                job = load_remote_job(f.read(), spec, writer)
            if job is None:
                return EXIT_FAILED
        except BaseException as exc:   # why: a launcher error with its cause, never an unexplained exit
            report_error(setup_failure(spec, exc, f"loading the job from {payload} on "
                                                  f"{os.uname().nodename} (the run folder must be on a "
                                                  f"file system the nodes share)"), writer)
            return EXIT_FAILED
        reporter = report_own(writer, spec.device)   # the notebook cannot read this node's /proc
        wait_for_store_before_rendezvous()   # ranks that start together: none pays torch's retry pause
        try:
            return run_rank(spec, job)
        finally:
            finished.set()
            reporter.stop()

    exit_with(body)
