"""Start ranks with os.fork: the fastest start, and the only one that can run a
function defined in a notebook cell without pickling it. Safe while the
parent holds no CUDA context (guards check that first)."""
from __future__ import annotations

import os
import sys

from .base import Backend, RankProcess


class ForkedRank(RankProcess):
    def __init__(self, local_rank: int, pid: int):
        self.local_rank = local_rank
        self.pid = pid
        self.sentinel = os.pidfd_open(pid)
        self._status = None

    def poll(self):
        if self._status is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self._status = ("exit", -1)
                return self._status
            if pid == 0:
                return None
            self._status = decode_wait_status(status)
        return self._status

    def release(self) -> None:
        if self.sentinel is not None:
            os.close(self.sentinel)
            self.sentinel = None


def decode_wait_status(status: int):
    if os.WIFSIGNALED(status):
        return ("signal", os.WTERMSIG(status))
    return ("exit", os.waitstatus_to_exitcode(status))


def warm_lazy_imports() -> None:
    """Import, once in the parent, what ranks would otherwise import after the fork: DDP's
    lazy torch._dynamo (1-4 s per rank, FIELD_NOTES) and our own in-rank modules (ms per rank)."""
    from .. import process_groups, progress, tqdm_bridge  # noqa: F401  (imported, not installed)
    if "torch" not in sys.modules:
        return
    try:
        import torch._dynamo  # noqa: F401  (DDP's first construction imports it)
        import torch.nn.parallel  # noqa: F401
    except Exception:
        pass


class ForkBackend(Backend):
    name = "fork"

    def prepare_parent(self) -> None:
        warm_lazy_imports()

    def start(self, plan, job, pipes_by_rank):
        from ..worker import run_forked_rank

        sys.stdout.flush()
        sys.stderr.flush()
        processes = []
        parent_pid = os.getpid()
        try:
            for spec in plan.ranks:
                pipes = pipes_by_rank[spec.local_rank]
                pid = os.fork()
                if pid == 0:  # child: never returns
                    run_forked_rank(spec, job, pipes, pipes_by_rank, parent_pid)
                processes.append(ForkedRank(spec.local_rank, pid))
                pipes.close_child_ends()
        except BaseException:
            for proc in processes:
                proc.kill()
                proc.poll()
            raise
        return processes
