"""A rank on a Ray cluster: the actor the notebook starts once per rank (``ray.launch``).

``describe`` tells the notebook where the actor landed (node address, the
interface that carries it, its GPUs, a free port there). ``run`` connects the
rank's three streams back to the notebook, points fds 1/2 and the event channel
at them, sets the same environment a local rank gets (``plan.rank_environment``, with the
attempt's restart count and the interface gloo and NCCL must bind), loads the cloudpickled job and runs
it with ``rank.runner.run_rank``: from there on a Ray rank is a local rank, but for its
resources, which it samples itself (``rank.reports.resources``: the notebook cannot read its /proc).
A persistent rank (``engines.ray.persistent``) is the same call whose job serves calls
until the notebook stops it (``engines.remote.serve``).

Nothing here imports Ray at module level: a node imports this module only
inside a Ray worker, where Ray is already loaded.
"""
from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
from typing import Any

from ...wire import protocol
from ...channels.sockets import connect_streams
from ...planning.net import free_port, interface_with_address
from ...rank.bootstrap import EXIT_FAILED, capture_output, flush_everything
from ...rank.reports.remote_where import Answerer, obey_notebook
from ...rank.reports.resources import report_own
from ..remote.assignment import RankAssignment

log = logging.getLogger("notebook_launch")


class RankActor:
    """One rank. Ray runs its methods one at a time on the worker's main thread."""

    def describe(self, want_port: bool) -> dict[str, Any]:
        import ray
        address = ray.util.get_node_ip_address()
        return {"node_id": ray.get_runtime_context().get_node_id(), "address": address,
                "interface": interface_with_address(address), "hostname": os.uname().nodename,
                "gpu_ids": [str(g) for g in ray.get_gpu_ids()], "pid": os.getpid(),
                "port": free_port() if want_port else None, "cpu_count": os.cpu_count() or 1}

    def run(self, assignment: RankAssignment, job_payload: bytes, channel: tuple[str, int, bytes]) -> int:
        """Run the rank; return its exit code. Output and events go to the notebook as it runs."""
        host, port, token = channel
        rank = assignment.global_rank
        socks = connect_streams(host, port, token, rank)
        saved_fds = (os.dup(1), os.dup(2))
        saved_streams = (sys.stdout, sys.stderr)
        saved_term = signal.getsignal(signal.SIGTERM)
        finished = threading.Event()
        events_fd = socks[0].fileno()
        code = EXIT_FAILED
        try:
            capture_output(os.dup(socks[1].fileno()), os.dup(socks[2].fileno()))
            socks[1].close()
            socks[2].close()
            writer = StoppableWriter(events_fd, answers_fd=socks[3].fileno())
            protocol.install(writer)
            signal.signal(signal.SIGTERM, writer.stop_rank)
            if assignment.persistent:   # the notebook's calls come on the events connection
                from ..remote.serve import listen
                listen(socks[0], finished, socks[3])
            else:
                threading.Thread(target=obey_notebook, args=(socks[0], Answerer(socks[3]), finished), daemon=True,
                                 name="notebook_launch-control").start()
            spec = assignment.spec(os.environ)
            os.environ.update(spec.env)
            from ...rank.spawn_entry import load_remote_job
            job = load_remote_job(job_payload, spec, writer)
            if job is not None:
                from ...rank.runner import run_rank
                reporter = report_own(writer, spec.device)   # the notebook cannot read this node's /proc
                try:
                    code = run_rank(spec, job)
                finally:
                    reporter.stop()
        except BaseException as exc:   # why: reported as the rank's failure, never an unexplained exit
            from ...rank.runner import report_error
            report_error(protocol.error_payload(exc, message=f"rank {rank} could not start on its Ray "
                                                f"actor: {type(exc).__name__}: {exc}"))
        finally:
            finished.set()
            signal.signal(signal.SIGTERM, saved_term)
            flush_everything()
            os.dup2(saved_fds[0], 1)
            os.dup2(saved_fds[1], 2)
            for fd in saved_fds:
                os.close(fd)
            sys.stdout, sys.stderr = saved_streams
            protocol.install(None)
            _close(socks[0])
            socks[3].close()
        return code


class StoppableWriter(protocol.EventWriter):
    """The rank's event channel, which goes quiet once the notebook stopped the rank: the
    notebook decided how the run ends, so what the stopped rank would report is moot."""
    muted = False

    def send(self, kind: protocol.EventKind, payload: Any) -> None:
        if not self.muted:
            super().send(kind, payload)

    def stop_rank(self, signum: int, frame: Any) -> None:
        """SIGTERM from the notebook (Stop, timeout, interrupt, another rank failed): unwind the
        user's code (its finally blocks run) and end the run call quietly, so Ray sees an actor
        that finished its task, not a crash (a crash prints a warning in the notebook)."""
        self.muted = True
        raise SystemExit(128 + signum)


def _close(sock: Any) -> None:
    """Shut the connection down first, so the notebook sees EOF and the control thread wakes."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        log.debug("events connection already closed", exc_info=True)
    sock.close()
