"""The rank side of ``start_method="xla"``: the launcher child that calls xmp.spawn,
and every replica (thread or process) it starts. See ``engines.xla.launcher`` for the layout.

Where a replica is (issue 20): replicas may be threads of one process, which has one
``whereabouts`` record and one stack dump for all of them, so each replica also keeps a record
of its own (a memfd named ``notebook_launch-xla-replica-<ordinal>``, the same layout, its own
thread's ident in the header) of the torch_xla collectives it issues (``xm.all_reduce``,
``all_gather``, ``reduce_scatter``, ..., and the blocking ``xm.rendezvous``).
``engines.xla.launcher`` reads them and splits the process's dump by thread.
"""
from __future__ import annotations

import dataclasses
import io
import os
import sys
import threading
import traceback
from typing import Any, Callable, Sequence

from ...wire import protocol
from ...errors.best_effort import best_effort
from ...detect.xla import stale_tpu_variables
from ...rank.bootstrap import (EXIT_FAILED, detach_from_parent, die_with_parent, flush_everything, install_std_streams,
                        redirect_fds, text_stream)
from ...channels import RankPipes
from ...wire.plan import LaunchPlan
from ...rank.runner import Job, report_error, reset_inherited_state, run_rank
from ...rank.reports import whereabouts
from ...wire.fork_locks import ForkRenewedLock

# Variables that name one rank. Threads of one process share os.environ, so
# these are set only where a process runs a single rank.
PER_RANK_VARIABLES = ("RANK", "LOCAL_RANK", "ROLE_RANK", "NOTEBOOK_LAUNCH_RANK")

# Set in the launcher child before xmp.spawn; replica processes inherit it by
# fork, so the user's function and arguments are never pickled.
_context = None
_process_lock = ForkRenewedLock()
_process_setup_pid = None


class ReplicaFailed(Exception):
    """A replica reported its error to the parent already; xmp.spawn only needs to end."""


@dataclasses.dataclass
class _Context:
    plan: LaunchPlan
    job: Job
    pipes_by_rank: Sequence[RankPipes]
    launcher_pid: int
    stdout: "ThreadRoutedStream"
    stderr: "ThreadRoutedStream"


def run_launcher(plan: LaunchPlan, job: Job, pipes_by_rank: Sequence[RankPipes], parent_pid: int,
                 nprocs: int | None) -> None:
    """Entry point of the launcher child. Never returns."""
    global _context
    code = EXIT_FAILED
    try:
        for pipes in pipes_by_rank:
            pipes.close_parent_ends()
        # A fresh Python's signals (bootstrap.reset_signal_state): SIGPIPE ignored among them, so
        # xmp.spawn's pool writing to a replica that died gets BrokenPipeError, not a dead launcher.
        detach_from_parent(parent_pid)
        first = pipes_by_rank[0]
        redirect_fds(first.stdout_w, first.stderr_w)
        out, err = ThreadRoutedStream(text_stream(1)), ThreadRoutedStream(text_stream(2))
        install_std_streams(out, err)
        os.environ.update(process_environment(plan))
        for key in stale_tpu_variables():  # the Kaggle workaround (detect.xla.STALE_TPU_VARIABLES)
            del os.environ[key]
        if plan.device_kind == "xla" and "PJRT_DEVICE" not in os.environ:
            os.environ["PJRT_DEVICE"] = "TPU"   # what torch_xla would guess, said outright
        protocol.install(protocol.EventWriter(first.events_w, answers_fd=first.answers_r))
        reset_inherited_state()
        _context = _Context(plan, job, pipes_by_rank, os.getpid(), out, err)
        import torch_xla.distributed.xla_multiprocessing as xmp
        xmp.spawn(replica_main, nprocs=nprocs, start_method="fork")
        code = 0
    except ReplicaFailed:
        pass  # the replica sent its ERROR already
    except BaseException as exc:   # why: reported as the launcher's failure, never an unexplained exit
        report_launcher_failure(exc)
    finally:
        try:
            if _context is not None:
                _context.stdout.flush_all()
                _context.stderr.flush_all()
        finally:
            flush_everything()
            os._exit(code)


def process_environment(plan: LaunchPlan) -> dict[str, str]:
    """The variables every rank shares (WORLD_SIZE, MASTER_ADDR, ...): what the launcher sets."""
    first = plan.ranks[0].env
    common = {k: v for k, v in first.items() if all(spec.env.get(k) == v for spec in plan.ranks)}
    for key in PER_RANK_VARIABLES:
        common.pop(key, None)
    common["NOTEBOOK_LAUNCH_RANK"] = first.get("NOTEBOOK_LAUNCH_RANK", "0")  # marks "inside a launch"
    return common


def replica_main(ordinal: int) -> None:
    """Runs in every replica (called by xmp.spawn with the global ordinal)."""
    import torch_xla
    import torch_xla.runtime as xr

    ctx = _context
    assert ctx is not None, "replica_main runs only under run_launcher"
    plan = ctx.plan
    threads = xr.addressable_device_count()
    device = str(torch_xla._XLAC._xla_get_default_device())   # "xla:0": this thread's device
    if ordinal >= len(plan.ranks) or xr.world_size() != plan.world_size:
        report_layout_mismatch(ctx, ordinal, xr.world_size())
        raise ReplicaFailed(ordinal)
    spec = plan.ranks[ordinal]
    pipes = ctx.pipes_by_rank[ordinal]
    _setup_process(ctx, pipes, first_device=device.endswith(":0"))
    out, err = text_stream(pipes.stdout_w), text_stream(pipes.stderr_w)
    ctx.stdout.register(out)
    ctx.stderr.register(err)
    protocol.install_for_thread(protocol.EventWriter(pipes.events_w, answers_fd=pipes.answers_r))
    # bookkeeping is a courtesy: the replica runs without it
    with best_effort("replica %d keeps no whereabouts record", ordinal):
        record_replica(ordinal)
    if threads == 1:  # this process is this rank alone: per-rank variables are safe
        os.environ.update({k: v for k, v in spec.env.items() if k in PER_RANK_VARIABLES})
    spec = dataclasses.replace(spec, device=f"{xr.device_type() or 'XLA'}:{ordinal}")
    try:
        code = run_rank(spec, ctx.job)
    finally:
        for stream in (out, err):
            with best_effort("flushing rank %d's output failed", ordinal):
                stream.flush()
    if code != 0:  # run_rank has sent the ERROR already
        raise ReplicaFailed(ordinal)


# --- where each replica is (issue 20) ------------------------------------------------------------
REPLICA_RECORD_NAME = "notebook_launch-xla-replica-"   # + the global ordinal
# torch_xla.core.xla_model's collectives. They are lazy: each adds an operation to the graph and
# returns; the replica waits in it when the graph runs (at the next sync, or a tensor's .cpu()),
# so the notebook infers who waits from how many each replica issued (engines.xla.launcher). The
# rendezvous run their graph at once, and are recorded as inside while they do.
XM_COLLECTIVES = ("all_reduce", "all_gather", "all_gather_bucketized", "reduce_scatter", "reduce_scatter_bucketized",
                  "all_to_all", "collective_permute", "collective_broadcast", "send", "recv")
XM_BLOCKING = ("rendezvous", "xla_rendezvous")
_replica_records: dict[int, "ReplicaRecord"] = {}   # thread ident -> the record of the replica it runs
_wrap_lock = ForkRenewedLock()


class ReplicaRecord(whereabouts.Record):
    """``whereabouts.Record`` for one replica: its own memfd, its own thread in the header."""

    def __init__(self, ordinal: int) -> None:
        super().__init__(f"{REPLICA_RECORD_NAME}{ordinal}")   # a name of its own: the notebook finds it by ordinal

    def announce(self, stacks_fd: int = 0, answers_fd: int = 0) -> None:
        """Its own thread in the header; its stacks are the process's (one answer for all replicas)."""
        whereabouts.HEADER.pack_into(self.map, 0, b"\0" * 8, os.getpid(), threading.get_ident(),
                                     whereabouts.DUMP_SIGNAL, stacks_fd, 0)
        self.map[0:8] = whereabouts.MAGIC


def record_replica(ordinal: int) -> None:
    """Give this replica (this thread) its record and wrap xm's collectives (once per process);
    nothing when the ranks' bookkeeping is left out (``whereabouts.SWITCH``)."""
    if not hasattr(os, "memfd_create") or whereabouts.switched_off():
        return
    import torch_xla.core.xla_model as xm

    record = ReplicaRecord(ordinal)
    _replica_records[threading.get_ident()] = record
    with _wrap_lock:
        for name in XM_COLLECTIVES + XM_BLOCKING:
            original = getattr(xm, name, None)
            if original is not None and not getattr(original, "_notebook_launch_wrapped", False):
                setattr(xm, name, _recording(name, original))
    record.announce()


_SKIPPED = ("/torch/", "/torch_xla/", f"{os.sep}notebook_launch{os.sep}")


def _caller(frame: Any) -> Any:
    """The user's frame that called the collective (outside torch, torch_xla and us)."""
    while frame is not None and any(part in frame.f_code.co_filename for part in _SKIPPED):
        frame = frame.f_back
    return frame


def _recording(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    blocking = name in XM_BLOCKING

    def collective(*args: Any, **kwargs: Any) -> Any:
        record = _replica_records.get(threading.get_ident())
        if record is None or record.depth:   # not a replica's thread, or inside another collective
            return original(*args, **kwargs)
        groups = kwargs.get("groups")
        group = "default group" if not groups else f"replica groups {groups}"
        seq = record.counts.get(group, 0) + 1
        record.counts[group] = seq
        frame = _caller(sys._getframe(1))
        first = args[1] if name in ("all_reduce", "reduce_scatter") and len(args) > 1 else (args[0] if args else None)
        key = (name, group, frame.f_code if frame is not None else None, frame.f_lineno if frame is not None else 0,
               getattr(first, "shape", None), getattr(first, "dtype", None))

        def describe() -> str:
            where = (frame.f_code.co_filename, str(frame.f_lineno), frame.f_code.co_name) if frame is not None \
                else ("", "0", "")
            tensors = f"tag {args[0]!r}" if blocking and args else whereabouts._describe_tensors((first,), {})
            return whereabouts.FIELD_SEP.join((name, group, tensors, *where))

        record.enter(key, seq, describe)
        if not blocking:
            record.leave()   # issued; the notebook works out whether the replica waits in it
        record.depth += 1
        try:
            return original(*args, **kwargs)
        finally:
            record.depth -= 1
            if blocking:
                record.leave()

    return whereabouts.marked_wrapper(collective, original, name)


def _setup_process(ctx: _Context, pipes: RankPipes, first_device: bool) -> None:
    """Once per replica process (not per thread): die with the launcher; C-level
    output to the rank of the process's first device."""
    global _process_setup_pid
    pid = os.getpid()
    if pid == ctx.launcher_pid:
        return
    with _process_lock:
        if _process_setup_pid != pid:
            _process_setup_pid = pid
            die_with_parent(ctx.launcher_pid)
        if first_device:
            os.dup2(pipes.stdout_w, 1)
            os.dup2(pipes.stderr_w, 2)


def report_layout_mismatch(ctx: _Context, ordinal: int, world_size: int) -> None:
    planned = len(ctx.plan.ranks)
    if ordinal != 0:
        return  # ordinal 0 always exists and reports for everyone: one clear error
    message = (f"torch_xla runs {world_size} replica(s) here but notebook_launch planned {planned} "
               f"from what it detected. Pass num_processes={world_size} (or None), or set "
               f"TPU_ACCELERATOR_TYPE / CPU_NUM_DEVICES to match the machine.")
    report_error(protocol.error_payload(exc_type="RuntimeError", message=message),
                 protocol.EventWriter(ctx.pipes_by_rank[ordinal].events_w,
                                      answers_fd=ctx.pipes_by_rank[ordinal].answers_r))


def report_launcher_failure(exc: BaseException) -> None:
    """xmp.spawn itself failed (runtime start, a replica process killed, ...): say so as rank 0."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    with best_effort("the launcher's stderr is gone"):
        sys.stderr.write(text)
    message = f"xmp.spawn failed in the XLA launcher process: {exc}"
    if type(exc).__name__ == "BrokenProcessPool":
        message = ("a replica process died without a Python exception (killed, out of memory, or a "
                   "fatal XLA error such as a collective that timed out); its last lines are in the "
                   "rank logs")
    # the launcher's main thread holds rank 0's channel
    report_error(protocol.error_payload(exc, message=message, traceback=text))


class ThreadRoutedStream(io.TextIOBase):
    """sys.stdout/err for a process whose threads are different ranks: each
    registered thread writes to its own rank's pipe, others to the default."""

    def __init__(self, default: io.TextIOWrapper) -> None:
        self._default = default
        self._by_thread: dict[int, io.TextIOWrapper] = {}

    def register(self, stream: io.TextIOWrapper) -> None:
        self._by_thread[threading.get_ident()] = stream

    def _target(self) -> io.TextIOWrapper:
        return self._by_thread.get(threading.get_ident(), self._default)

    def write(self, text: str) -> int:
        return self._target().write(text)

    def flush(self) -> None:
        self._target().flush()

    def flush_all(self) -> None:
        for stream in [self._default, *self._by_thread.values()]:
            with best_effort("flushing a replica's stream failed"):
                stream.flush()

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self._target().fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"

    @property
    def errors(self) -> str:  # type: ignore[override]
        return "backslashreplace"

