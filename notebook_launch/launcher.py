"""notebook_launcher: call -> plan -> guards -> backend starts ranks -> supervisor -> results."""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

from . import guards
from .backends.base import RankPipes
from .display import UI_CHOICES, choose_display
from .environment import cuda_gpus, detect
from .errors import GuardError, LaunchArgumentError, LaunchError
from .output import RunLogs, make_run_id
from .plan import DEFAULT_USE_PORT, _DefaultPort, build_plan, free_port, port_is_free
from .state import DONE, RankState, RunState
from .supervisor import Supervisor
from .worker import Job
from .xla_env import check_runtime_not_initialized, resolve_num_ranks, xla_launch_info, xla_note

START_METHODS = (None, "fork", "spawn", "xla")
RDZV_BACKENDS = ("static", "c10d", "etcd", "etcd-v2")
_SAVED_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGCHLD")


def notebook_launcher(function, args=(), num_processes=None, mixed_precision="no",
                      use_port=DEFAULT_USE_PORT, master_addr="127.0.0.1", node_rank=0,
                      num_nodes=1, rdzv_backend="static", rdzv_endpoint="", rdzv_conf=None,
                      rdzv_id="none", max_restarts=0, monitor_interval=0.1,
                      log_line_prefix_template=None, *, kwargs=None, start_method=None,
                      timeout=None, log_dir=None, ui="auto", rdzv_timeout=None):
    """Run ``function(*args, **kwargs)`` on ``num_processes`` ranks and return every rank's result.

    The first fourteen parameters mean what they mean in Hugging Face Accelerate's
    ``notebook_launcher``, so swapping the import is enough. Beyond them:

    kwargs: keyword arguments for ``function``.
    start_method: "fork" (default where safe), "spawn" (ships the function with cloudpickle) or
        "xla" (torch_xla's xmp.spawn; the default when a TPU or PJRT_DEVICE is found, and then
        num_processes counts XLA devices: None or all of them, or 1).
    timeout: seconds after which every rank is stopped and LaunchError names those still running.
    log_dir: folder for the per-rank logs; by default a new folder per run in the user cache.
    ui: "auto", "widget", "html", "rich", "text" or "none".
    rdzv_timeout: seconds every node has to join the rendezvous (multi-node or max_restarts > 0);
        default rdzv_conf's "join_timeout"/"timeout", else 900 s (torch elastic's default).

    Returns a list with each local rank's return value, in rank order (tensors moved to CPU).
    Raises LaunchError when a rank fails (naming it, with its traceback), GuardError when
    launching now would misbehave, LaunchArgumentError for invalid arguments.
    """
    __tracebackhide__ = True  # noqa: F841  (IPython and pytest hide this frame)
    arguments = dict(locals())
    del arguments["__tracebackhide__"]
    try:
        return _launch(**arguments)
    except (LaunchError, GuardError, LaunchArgumentError, KeyboardInterrupt) as err:
        # The user needs the rank's traceback (in the message), not our supervisor's frames.
        raise err.with_traceback(None) from None


def _launch(*, function, args, num_processes, mixed_precision, use_port, master_addr, node_rank,
            num_nodes, rdzv_backend, rdzv_endpoint, rdzv_conf, rdzv_id, max_restarts,
            monitor_interval, log_line_prefix_template, kwargs, start_method, timeout, log_dir, ui,
            rdzv_timeout):
    """The launch itself; notebook_launcher only trims the traceback of its errors."""
    guards.check_not_inside_rank()
    guards.validate_function(function)
    guards.validate_args(args, kwargs)
    mixed_precision = guards.normalize_mixed_precision(mixed_precision)
    guards.validate_choice("start_method", start_method, START_METHODS)
    guards.validate_choice("ui", ui, UI_CHOICES)
    guards.validate_choice("rdzv_backend", rdzv_backend, RDZV_BACKENDS)
    num_nodes = guards.validate_int("num_nodes", num_nodes, 1)
    node_rank = guards.validate_int("node_rank", node_rank, 0, num_nodes - 1)
    max_restarts = guards.validate_int("max_restarts", max_restarts, 0)
    timeout = guards.validate_timeout(timeout)
    port = guards.validate_port(use_port)
    if not isinstance(monitor_interval, (int, float)) or monitor_interval <= 0:
        raise LaunchArgumentError(f"monitor_interval must be a number of seconds > 0; got {monitor_interval!r}")
    if log_line_prefix_template is not None and not isinstance(log_line_prefix_template, str):
        raise LaunchArgumentError("log_line_prefix_template must be a str such as '[{rank}]: ' or None")
    elastic = num_nodes > 1 or max_restarts > 0   # torch.distributed.elastic's agent (backends/elastic.py)

    where = detect()  # platform and devices; TPUs (where.has_tpu) are the xla backend's
    device_count = where.device_count if where.device_kind == "cuda" else 0
    device_kind = "cuda" if device_count > 0 else "cpu"
    xla = xla_launch_info(start_method)   # TPU (or PJRT_DEVICE) with torch_xla: xmp.spawn
    if xla is not None:
        device_kind, start_method = "xla", "xla"
        num_processes = resolve_num_ranks(num_processes, xla)   # counts XLA devices
    else:
        if num_processes is None:
            num_processes = device_count or 1
        num_processes = guards.validate_num_processes(num_processes, device_kind, device_count)
    start_method = start_method or default_start_method()
    guards.check_no_accelerate_state()
    guards.check_cuda_not_initialized(start_method)
    if xla is not None:
        check_runtime_not_initialized()

    notes = [xla_note(xla, num_processes)] if xla is not None else []
    if not (elastic and rdzv_endpoint):  # an explicit rdzv_endpoint names the store's port instead
        port = resolve_port(port, explicit=not isinstance(use_port, _DefaultPort),
                            master_addr=master_addr, node_rank=node_rank, notes=notes,
                            multi_node=num_nodes > 1)
    run_id = make_run_id()
    gpus = cuda_gpus() if device_kind == "cuda" else ()
    plan = build_plan(
        num_processes=num_processes, num_nodes=num_nodes, node_rank=node_rank,
        master_addr=master_addr, master_port=port, device_kind=device_kind,
        mixed_precision=mixed_precision, start_method=start_method, run_id=run_id,
        gpu_names=[g[0] for g in gpus], driver_version=gpus[0][1] if gpus else None, notes=notes)
    job = Job(function, tuple(args), dict(kwargs or {}))
    if elastic:
        from .backends.elastic_run import run_elastic
        from .rendezvous import settings_from_arguments
        rendezvous = settings_from_arguments(
            rdzv_backend=rdzv_backend, rdzv_endpoint=rdzv_endpoint, rdzv_conf=rdzv_conf,
            rdzv_id=rdzv_id, rdzv_timeout=rdzv_timeout, master_addr=master_addr, port=port,
            node_rank=node_rank, num_nodes=num_nodes,
            may_move_port=isinstance(use_port, _DefaultPort))
        return run_elastic(plan, job, rendezvous=rendezvous, max_restarts=max_restarts, run_id=run_id,
                           log_dir=log_dir, ui=ui, timeout=timeout,
                           poll_interval=min(float(monitor_interval), 0.1),
                           line_prefix=log_line_prefix_template)
    return run_plan(plan, job, run_id=run_id, log_dir=log_dir, ui=ui, timeout=timeout,
                    poll_interval=min(float(monitor_interval), 0.1),
                    line_prefix=log_line_prefix_template, platform=where.platform)


def default_start_method() -> str:
    """fork where it is safe (Linux); spawn elsewhere: Windows has no fork, and macOS
    system frameworks crash in forked children (CPython defaults to spawn there too)."""
    return "fork" if hasattr(os, "fork") and sys.platform.startswith("linux") else "spawn"


def resolve_port(port: int, *, explicit: bool, master_addr: str, node_rank: int, notes: list,
                 multi_node: bool = False) -> int:
    """Only the node that hosts the rendezvous store (node 0) needs the port free."""
    if node_rank != 0 or port_is_free(port):
        return port
    if multi_node:  # the other nodes were told this port: we cannot pick another one for them
        raise LaunchArgumentError(
            f"use_port={port} is already in use on node 0 (another launch, or a process still holding "
            f"it). Pass a free use_port, the same one on every node.")
    if explicit:
        raise LaunchArgumentError(
            f"use_port={port} is already in use on this machine (another launch, or a process "
            f"still holding it). Pass another port, or leave use_port at its default to pick a free one.")
    chosen = free_port()
    notes.append(f"port {port} is busy; using port {chosen} instead")
    return chosen


def get_backend(start_method: str):
    if start_method == "fork":
        from .backends.fork import ForkBackend
        return ForkBackend()
    if start_method == "spawn":
        from .backends.spawn import SpawnBackend
        return SpawnBackend()
    if start_method == "xla":
        from .backends.xla import XlaBackend
        return XlaBackend()
    raise NotImplementedError(f"start_method={start_method!r} is not available; use 'fork', 'spawn' or 'xla'")


def run_plan(plan, job, *, run_id, log_dir, ui, timeout, poll_interval, line_prefix, platform=None):
    """Start the plan's ranks and supervise them until results or one clear error."""
    backend = get_backend(plan.start_method)
    backend.prepare_parent()
    logs = RunLogs(run_id, [r.local_rank for r in plan.ranks], [r.global_rank for r in plan.ranks], log_dir)
    state = RunState(run_id=run_id, world_size=plan.world_size, backend=backend.name,
                     log_dir=str(logs.path), node_rank=plan.node_rank, num_nodes=plan.num_nodes,
                     ranks=[RankState(rank=r.global_rank, local_rank=r.local_rank, device=r.device)
                            for r in plan.ranks])
    display = choose_display(ui, line_prefix=line_prefix)
    print(launch_summary(plan, backend.name, logs.path, platform=platform,
                         display=display_name(display)), flush=True)
    pipes = []
    try:
        with presenting(state, display, logs):
            pipes = [RankPipes.open() for _ in plan.ranks]
            processes = backend.start(plan, job, pipes)
            supervisor = Supervisor(plan, processes, pipes, state, display, logs,
                                    timeout=timeout, poll_interval=poll_interval)
            results = supervisor.run()
            state.finish(DONE, f"{plan.num_processes} ranks finished in {state.elapsed:.1f} s")
            return results
    finally:
        for p in pipes:
            p.close_parent_ends()
            p.close_child_ends()


@contextlib.contextmanager
def presenting(state, display, logs):
    """What every run does around its ranks: interrupts reach us as KeyboardInterrupt, the
    display starts and always closes with the final state, the logs close, and the notebook
    gets its signal handlers back exactly as they were."""
    saved = _save_signal_handlers()
    try:
        _ensure_interruptible()
        display.start(state)
        yield
    finally:
        if state.ended_at is None:
            state.finish("stopped", "interrupted")
        try:
            display.close(state)
        finally:
            logs.close()
            _restore_signal_handlers(saved)


def launch_summary(plan, backend_name: str, log_path, platform=None, display=None) -> str:
    """One line that says what the launcher chose and why it matters: where, on what, how."""
    what = {"cpu": "CPU", "cuda": "CUDA GPU", "xla": "XLA"}[plan.device_kind]
    nodes = f" on node {plan.node_rank} of {plan.num_nodes}" if plan.num_nodes > 1 else ""
    where = f" on {platform}" if platform else ""
    shown = f", display {display}" if display else ""
    line = (f"notebook_launch: {plan.num_processes} rank{'s' if plan.num_processes != 1 else ''}{where} "
            f"({what}, {plan.dist_backend}, {backend_name}){nodes}, port {plan.master_port}{shown}; "
            f"logs: {log_path}")
    for note in plan.notes:
        line += f"\nnotebook_launch: {note}"
    return line


def display_name(display) -> str:
    """"text", "widget", ...: the ``ui`` value that selects this display."""
    return display.name


def _save_signal_handlers():
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {name: signal.getsignal(getattr(signal, name)) for name in _SAVED_SIGNALS
            if hasattr(signal, name)}


def _restore_signal_handlers(saved) -> None:
    for name, handler in saved.items():
        if handler is not None:
            signal.signal(getattr(signal, name), handler)


def _ensure_interruptible() -> None:
    """An interrupt must reach the supervisor as KeyboardInterrupt, even if SIGINT was ignored."""
    if threading.current_thread() is threading.main_thread():
        if signal.getsignal(signal.SIGINT) in (signal.SIG_IGN, signal.SIG_DFL, None):
            signal.signal(signal.SIGINT, signal.default_int_handler)
