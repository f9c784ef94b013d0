"""Start ranks on TPUs (or PJRT_DEVICE=CPU) with torch_xla's xmp.spawn.

xmp.spawn lays replicas out itself: one process per TPU chip, one thread per
XLA device of that chip (a v2-8/v3-8 is 4 processes x 2 threads; PJRT on CPU
is 1 process x CPU_NUM_DEVICES threads). It drops return values, does not stop
the other replicas when one fails, and refuses to start once the runtime is
initialized. So the parent forks one *launcher* child that calls
``xmp.spawn(nprocs=None or 1, start_method="fork")``; every replica, thread or
process, finds its own rank's pipes (opened by the parent before the fork) by
its global ordinal and runs ``worker.run_rank`` with them. Each ordinal is
one rank: one panel row, one RESULT or ERROR. The launcher leads a process
group that holds every replica, so the supervisor stops all of them at once.

Output: a replica that is the only thread of its process owns fds 1/2. Threads
of one process share fds 1/2, so Python-level writes (print, logging to
sys.stdout/err) are routed per thread by ``ThreadRoutedStream``; C-level
output of such a process lands on its first device's rank.
"""
from __future__ import annotations

import dataclasses
import io
import os
import sys
import threading
import traceback

from .. import channel
from ..xla_env import stale_tpu_variables
from .base import Backend
from .fork import ForkedRank

# Variables that name one rank. Threads of one process share os.environ, so
# these are set only where a process runs a single rank.
PER_RANK_VARIABLES = ("RANK", "LOCAL_RANK", "ROLE_RANK", "NOTEBOOK_LAUNCH_RANK")

# Set in the launcher child before xmp.spawn; replica processes inherit it by
# fork, so the user's function and arguments are never pickled.
_context = None
# What importing torch_xla wrote into os.environ when prepare_parent imported it
# (kept for every later launch of this notebook: torch_xla is imported only once).
_import_environ = {}
_process_lock = threading.Lock()
_process_setup_pid = None


class ReplicaFailed(Exception):
    """A replica reported its error to the parent already; xmp.spawn only needs to end."""


class XlaLauncherProcess(ForkedRank):
    """The launcher child: one process that carries every ordinal of the run."""

    def __init__(self, local_ranks, pid: int):
        super().__init__(local_ranks[0], pid)
        self.local_ranks = tuple(local_ranks)


class XlaBackend(Backend):
    name = "xla"

    def prepare_parent(self) -> None:
        """Import torch_xla once in the notebook, so each launch's forked launcher
        shares it instead of importing it again (5-20 s). Importing does not start
        the runtime; what it writes into os.environ (XLA_FLAGS, PJRT_DYNAMIC_PLUGINS,
        ...) is undone here and set in every launcher instead, so the notebook's
        environment stays as it was."""
        global _import_environ
        if "torch_xla.distributed.xla_multiprocessing" in sys.modules:
            return
        before = dict(os.environ)
        try:
            import torch_xla.distributed.xla_multiprocessing  # noqa: F401
        except Exception:
            pass  # the launcher imports it again and reports the error as rank 0's
        finally:
            changed = {k: v for k, v in os.environ.items() if before.get(k) != v}
            for key in changed:
                if key in before:
                    os.environ[key] = before[key]
                else:
                    del os.environ[key]
            _import_environ = changed

    def start(self, plan, job, pipes_by_rank):
        sys.stdout.flush()
        sys.stderr.flush()
        parent_pid = os.getpid()
        nprocs = 1 if len(plan.ranks) == 1 else None  # the only values PJRT accepts
        pid = os.fork()
        if pid == 0:  # child: never returns
            os.environ.update(_import_environ)
            run_launcher(plan, job, pipes_by_rank, parent_pid, nprocs)
        for pipes in pipes_by_rank:
            pipes.close_child_ends()
        return [XlaLauncherProcess([spec.local_rank for spec in plan.ranks], pid)]


@dataclasses.dataclass
class _Context:
    plan: object
    job: object
    pipes_by_rank: list
    launcher_pid: int
    stdout: "ThreadRoutedStream"
    stderr: "ThreadRoutedStream"


def run_launcher(plan, job, pipes_by_rank, parent_pid, nprocs):
    """Entry point of the launcher child. Never returns."""
    from ..worker import EXIT_FAILED, detach_from_parent, flush_everything, reset_inherited_state

    global _context
    code = EXIT_FAILED
    try:
        for pipes in pipes_by_rank:
            pipes.close_parent_ends()
        detach_from_parent(parent_pid)
        first = pipes_by_rank[0]
        flush_everything()
        os.dup2(first.stdout_w, 1)
        os.dup2(first.stderr_w, 2)
        out, err = ThreadRoutedStream(_text_stream(1)), ThreadRoutedStream(_text_stream(2))
        sys.stdout = sys.__stdout__ = out
        sys.stderr = sys.__stderr__ = err
        os.environ.update(process_environment(plan))
        for key in stale_tpu_variables():  # the Kaggle workaround (xla_env.STALE_TPU_VARIABLES)
            del os.environ[key]
        if plan.device_kind == "xla" and "PJRT_DEVICE" not in os.environ:
            os.environ["PJRT_DEVICE"] = "TPU"   # what torch_xla would guess, said outright
        channel.install(channel.EventWriter(first.events_w))
        reset_inherited_state()
        _context = _Context(plan, job, pipes_by_rank, os.getpid(), out, err)
        import torch_xla.distributed.xla_multiprocessing as xmp
        xmp.spawn(replica_main, nprocs=nprocs, start_method="fork")
        code = 0
    except ReplicaFailed:
        pass
    except BaseException as exc:
        report_launcher_failure(exc)
    finally:
        try:
            if _context is not None:
                _context.stdout.flush_all()
                _context.stderr.flush_all()
        finally:
            flush_everything()
            os._exit(code)


def process_environment(plan) -> dict:
    """The variables every rank shares (WORLD_SIZE, MASTER_ADDR, ...): what the launcher sets."""
    first = plan.ranks[0].env
    common = {k: v for k, v in first.items() if all(spec.env.get(k) == v for spec in plan.ranks)}
    for key in PER_RANK_VARIABLES:
        common.pop(key, None)
    common["NOTEBOOK_LAUNCH_RANK"] = first.get("NOTEBOOK_LAUNCH_RANK", "0")  # marks "inside a launch"
    return common


def replica_main(ordinal: int):
    """Runs in every replica (called by xmp.spawn with the global ordinal)."""
    from ..worker import run_rank
    import torch_xla
    import torch_xla.runtime as xr

    ctx = _context
    plan = ctx.plan
    threads = xr.addressable_device_count()
    device = str(torch_xla._XLAC._xla_get_default_device())   # "xla:0": this thread's device
    if ordinal >= len(plan.ranks) or xr.world_size() != plan.world_size:
        report_layout_mismatch(ctx, ordinal, xr.world_size())
        raise ReplicaFailed(ordinal)
    spec = plan.ranks[ordinal]
    pipes = ctx.pipes_by_rank[ordinal]
    _setup_process(ctx, pipes, first_device=device.endswith(":0"))
    out, err = _text_stream(pipes.stdout_w), _text_stream(pipes.stderr_w)
    ctx.stdout.register(out)
    ctx.stderr.register(err)
    channel.install_for_thread(channel.EventWriter(pipes.events_w))
    if threads == 1:  # this process is this rank alone: per-rank variables are safe
        os.environ.update({k: v for k, v in spec.env.items() if k in PER_RANK_VARIABLES})
    spec = dataclasses.replace(spec, device=f"{xr.device_type() or 'XLA'}:{ordinal}")
    try:
        code = run_rank(spec, ctx.job)
    finally:
        for stream in (out, err):
            try:
                stream.flush()
            except Exception:
                pass
    if code != 0:  # run_rank has sent the ERROR already
        raise ReplicaFailed(ordinal)


def _setup_process(ctx, pipes, first_device: bool) -> None:
    """Once per replica process (not per thread): die with the launcher; C-level
    output to the rank of the process's first device."""
    global _process_setup_pid
    pid = os.getpid()
    if pid == ctx.launcher_pid:
        return
    with _process_lock:
        if _process_setup_pid != pid:
            _process_setup_pid = pid
            from ..worker import PR_SET_PDEATHSIG
            try:
                import ctypes
                import signal
                ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            except (OSError, AttributeError):
                pass
            if os.getppid() != ctx.launcher_pid:
                os._exit(1)
        if first_device:
            os.dup2(pipes.stdout_w, 1)
            os.dup2(pipes.stderr_w, 2)


def report_layout_mismatch(ctx, ordinal: int, world_size: int) -> None:
    planned = len(ctx.plan.ranks)
    if ordinal != 0:
        return  # ordinal 0 always exists and reports for everyone: one clear error
    message = (f"torch_xla runs {world_size} replica(s) here but notebook_launch planned {planned} "
               f"from what it detected. Pass num_processes={world_size} (or None), or set "
               f"TPU_ACCELERATOR_TYPE / CPU_NUM_DEVICES to match the machine.")
    channel.EventWriter(ctx.pipes_by_rank[ordinal].events_w).send(channel.ERROR, {
        "kind": "exception", "type": "RuntimeError", "message": message, "traceback": ""})


def report_launcher_failure(exc: BaseException) -> None:
    """xmp.spawn itself failed (runtime start, a replica process killed, ...): say so as rank 0."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        sys.stderr.write(text)
    except Exception:
        pass
    writer = channel.current()   # the launcher's main thread: rank 0's channel
    if writer is None:
        return
    message = f"xmp.spawn failed in the XLA launcher process: {exc}"
    if type(exc).__name__ == "BrokenProcessPool":
        message = ("a replica process died without a Python exception (killed, out of memory, or a "
                   "fatal XLA error such as a collective that timed out); its last lines are in the "
                   "rank logs")
    writer.send(channel.ERROR, {
        "kind": "exception", "type": type(exc).__qualname__, "message": message, "traceback": text})


class ThreadRoutedStream(io.TextIOBase):
    """sys.stdout/err for a process whose threads are different ranks: each
    registered thread writes to its own rank's pipe, others to the default."""

    def __init__(self, default):
        self._default = default
        self._by_thread = {}

    def register(self, stream) -> None:
        self._by_thread[threading.get_ident()] = stream

    def _target(self):
        return self._by_thread.get(threading.get_ident(), self._default)

    def write(self, text) -> int:
        return self._target().write(text)

    def flush(self) -> None:
        self._target().flush()

    def flush_all(self) -> None:
        for stream in [self._default, *self._by_thread.values()]:
            try:
                stream.flush()
            except Exception:
                pass

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self._target().fileno()

    @property
    def encoding(self):
        return "utf-8"

    @property
    def errors(self):
        return "backslashreplace"


def _text_stream(fd: int):
    raw = io.FileIO(fd, "w", closefd=False)
    return io.TextIOWrapper(io.BufferedWriter(raw), encoding="utf-8",
                            errors="backslashreplace", line_buffering=True, write_through=False)
