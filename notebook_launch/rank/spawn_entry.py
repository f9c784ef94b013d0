"""Entry point of a spawned rank (started by ``engines.local.spawn``): detach from
the notebook like a forked rank, open the event channel, restore the
notebook's context, load the job and run it with ``rank.runner.run_rank``.

If the job cannot be loaded here (a module the function needs is missing in
a fresh interpreter), the rank reports an ERROR that says what to do.
"""
from __future__ import annotations

import mmap
import os
import pickle
import sys
from dataclasses import dataclass
from typing import Any

from ..wire import protocol, shared_tensors
from ..errors.debug_logging import debug_logging_from_environment
from . import device_backends, spawn_context
from .bootstrap import EXIT_FAILED, capture_output, detach_from_parent, exit_with
from .runner import report_error, run_rank, setup_failure


@dataclass
class EntryArgs:
    """What the launcher passes (``engines.local.spawn._entry_args``)."""
    payload_fd: int = -1                  # the pickled job, in a file with no name
    local_rank: int = -1
    events_fd: int = -1
    parent_pid: int = -1
    events_parent_fd: int | None = None   # to reopen a pipe the function closed
    answers_fd: int | None = None         # the notebook's answers to prompts
    exit_fd: int | None = None
    tensors_fd: int | None = None         # this rank's result file
    job_tensors_fd: int | None = None     # the job's tensors
    forked_by: int | None = None          # the warm start process that forked it: it dies with that one
    load_device_backends: int | None = None   # 1: that process imported torch without them (rank.device_backends)


REQUIRED = ("payload_fd", "local_rank", "events_fd", "parent_pid")


def parse_args(argv: list[str]) -> EntryArgs:
    """``--name value`` pairs, as our launcher writes them. Not argparse: building its parser took
    5 of a rank's 6 ms of start-up here (its regular expressions and gettext), and only our own
    launcher ever calls this entry."""
    args = EntryArgs()
    if len(argv) % 2:
        raise SystemExit(f"spawn_entry: arguments come in --name value pairs: {argv}")
    for option, value in zip(argv[::2], argv[1::2]):
        name = option.removeprefix("--").replace("-", "_")
        if not option.startswith("--") or name not in EntryArgs.__dataclass_fields__:
            raise SystemExit(f"spawn_entry: unknown argument {option}")
        setattr(args, name, int(value))
    missing = [name for name in REQUIRED if getattr(args, name) == -1]
    if missing:
        raise SystemExit(f"spawn_entry: missing {', '.join('--' + m.replace('_', '-') for m in missing)}")
    return args


def main(argv: list[str] | None = None) -> None:
    """Never returns: the process ends with the rank's exit code."""
    def body() -> int:
        args = parse_args(sys.argv[1:] if argv is None else argv)
        debug_logging_from_environment()   # a forked rank inherits the notebook's handler; a spawned one its variable
        # Its parent: the notebook, or the warm start process that forked it (which ends with the notebook).
        detach_from_parent(args.forked_by if args.forked_by is not None else args.parent_pid)
        for fd in (args.events_fd, args.answers_fd, args.exit_fd, args.tensors_fd, args.job_tensors_fd,
                   args.payload_fd):
            if fd is not None:  # the user's own subprocesses must not hold them
                os.set_inheritable(fd, False)
        capture_output(1, 2)
        reopen = None if args.events_parent_fd is None else protocol.parent_end(args.parent_pid,
                                                                                 args.events_parent_fd)
        writer = protocol.EventWriter(args.events_fd, reopen=reopen, answers_fd=args.answers_fd,
                                      tensors_fd=args.tensors_fd)
        protocol.install(writer)
        try:
            loaded = None
            if not args.load_device_backends or device_backends.load(writer):
                loaded = load_job(args.payload_fd, args.local_rank, writer, args.job_tensors_fd)
        finally:   # the job's tensors map its pages; the fds themselves are not needed any more
            for fd in (args.payload_fd, args.job_tensors_fd):
                if fd is not None:
                    os.close(fd)
        if loaded is None:
            return EXIT_FAILED
        spec, job, context = loaded
        try:
            spawn_context.restore_state(context)
        except BaseException as exc:   # why: a launcher error with its cause, never an unexplained exit
            report_error(setup_failure(spec, exc, "restoring the notebook's state (rank.spawn_context)"), writer)
            return EXIT_FAILED
        return run_rank(spec, job)

    exit_with(body)


def load_job(payload_fd: int, local_rank: int, writer: protocol.EventWriter,
             tensors_fd: int | None = None) -> tuple[Any, Any, dict] | None:
    """(spec, job, context), or None after reporting why the job cannot run here. The payload is
    read through a mapping of its file (every rank shares the fd's offset, so not ``read``).
    The job's tensors map the pages of ``tensors_fd`` copy-on-write (see shared_tensors)."""
    with mmap.mmap(payload_fd, 0, access=mmap.ACCESS_READ) as mapped:
        payload = pickle.loads(mapped)
    spec = payload["specs"][local_rank]
    context = payload["context"]
    spawn_context.restore_paths(context)
    try:
        job = shared_tensors.loads(payload["job"], tensors_fd)
    except Exception as exc:   # why: a job that cannot be loaded is reported as the rank's error
        report_unloadable_job(writer, spec, exc)
        return None
    return spec, job, context


def load_remote_job(payload: bytes, spec: Any, writer: protocol.EventWriter) -> Any:
    """A rank on another machine's job (Ray's actor, SLURM's task), from the payload the notebook
    pickled (``{"context": ..., "job": cloudpickle bytes}``), with the notebook's paths restored
    before and its state after the unpickling; None after reporting a job that cannot be loaded."""
    data = pickle.loads(payload)
    spawn_context.restore_paths(data["context"])
    import cloudpickle
    try:
        job = cloudpickle.loads(data["job"])
    except Exception as exc:   # why: any error unpickling the user's job is reported as that rank's failure
        report_unloadable_job(writer, spec, exc)
        return None
    spawn_context.restore_state(data["context"])
    return job


def report_unloadable_job(writer: protocol.EventWriter, spec: Any, exc: BaseException) -> None:
    missing = getattr(exc, "name", None) if isinstance(exc, ImportError) else None
    what = f"the module {missing!r}" if missing else "something the function refers to"
    writer.send(protocol.ERROR, protocol.error_payload(exc, message=(
        f"rank {spec.global_rank} could not load the launched function in its fresh Python "
        f"process: {type(exc).__name__}: {exc}. With start_method='spawn' each rank unpickles "
        f"the function and its arguments, so {what} must be importable there. The notebook's "
        f"working directory and sys.path are restored in the rank; a module that only exists "
        f"in the notebook's memory is not. What to do: define that code in a notebook cell "
        f"(it is then shipped by value), put its file in a folder on sys.path or install it "
        f"with pip, or use start_method='fork' where it is safe.")))


if __name__ == "__main__":  # python -m notebook_launch.rank.spawn_entry ... works too
    main()
