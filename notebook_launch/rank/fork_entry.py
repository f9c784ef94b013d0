"""Entry point of a forked rank (started by ``engines.local.fork``): keep only this rank's
pipe ends, detach from the notebook, capture output, open the event channel, run."""
from __future__ import annotations

import os
from typing import Sequence

from ..wire import protocol
from ..channels import RankPipes
from ..wire.plan import RankSpec
from . import environment
from .bootstrap import (Dispositions, EncodedEnvironment, capture_output, detach_from_parent, encode_environment,
                        exit_with)
from .runner import Job, run_rank


def fds_to_close(pipes: "RankPipes", all_pipes: Sequence["RankPipes"]) -> tuple[int, ...]:
    """The launch's fds that the rank of ``pipes`` closes at its start: every rank's, open now,
    but its own child ends and result file. Listed in the notebook just before its forks (no pipe
    of the launch is opened or closed between them), so the rank closes them without walking every
    rank's pipes (and writing to their objects, pages it would copy: issue 45)."""
    keep = set(pipes.child_ends()) | {pipes.tensors}
    return tuple(fd for other in all_pipes for fd in other.all_fds() if fd not in keep and fd not in other.closed)


def run_forked_rank(spec: "RankSpec", job: "Job", pipes: "RankPipes", all_pipes: Sequence["RankPipes"],
                    parent_pid: int, env: "environment.PreparedEnvironment | EncodedEnvironment | None" = None,
                    signals: Dispositions | None = None, close: tuple[int, ...] | None = None) -> None:
    """Entry point of a forked child. Never returns. ``env``: the rank's environment built in the
    notebook before the fork (``environment.prepare``), else ``spec.env`` encoded here; ``signals``:
    the signals to reset (``bootstrap.signals_to_reset``, read in the notebook), else every one;
    ``close``: ``fds_to_close``, listed in the notebook, else listed here."""
    def body() -> int:
        for fd in fds_to_close(pipes, all_pipes) if close is None else close:
            try:
                os.close(fd)
            except OSError:
                pass   # closed already
        detach_from_parent(parent_pid, signals)
        capture_output(pipes.stdout_w, pipes.stderr_w)
        environment.install(encode_environment(spec.env) if env is None else env)
        protocol.install(protocol.EventWriter(pipes.events_w, reopen=protocol.parent_end(parent_pid, pipes.events_r),
                                              answers_fd=pipes.answers_r, tensors_fd=pipes.tensors))
        return run_rank(spec, job, forked_from_notebook=True)

    exit_with(body)
