"""The launch options: ``notebook_launcher``'s parameters, checked once and frozen.

Every argument check runs in ``launch_options`` before anything is detected or started; the checks
themselves, one per argument with the limits they check against, are ``option_checks``'s (re-exported
here: callers import them from this module). Checks that need to know the machine (num_processes
against the GPUs seen) are called once detection has run (``target``).
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from ..display import NOTEBOOK_LINES_PER_SECOND, Display
from ..display.cell_budget import DEFAULT_CELL_OUTPUT
from ..errors import LaunchArgumentError
from ..record.line_prefix import parse_line_prefix
from .net import DEFAULT_PORT
from ..wire.plan import StartMethod
from ..diagnose.stall import DEFAULT_STALL_AFTER
from .option_checks import (DEFAULT_RDZV_TIMEOUT, MAX_WORLD_SIZE, MIXED_PRECISION_CHOICES, START_METHODS,
                            check_display_ranks_exist, check_world_size, control_characters, default_start_method,
                            max_cpu_ranks, normalize_mixed_precision, seconds_or_none, validate_args,
                            validate_call, validate_cell_output, validate_choice, validate_cluster_launch,
                            validate_cluster_type, validate_display_ranks, validate_elastic_start_method,
                            validate_function, validate_int, validate_interrupt_grace, validate_lines_per_second,
                            validate_log_dir, validate_master_addr, validate_monitor_interval,
                            validate_num_processes, validate_port, validate_rendezvous, validate_seconds,
                            validate_start_method, validate_text, validate_timeout, validate_ui,
                            validate_whole_number)

__all__ = ["DEFAULT_LINES_PER_SECOND", "DEFAULT_USE_PORT", "LaunchOptions", "RDZV_BACKENDS", "launch_options",
           "DEFAULT_RDZV_TIMEOUT", "MAX_WORLD_SIZE", "MIXED_PRECISION_CHOICES", "START_METHODS",
           "check_display_ranks_exist", "check_world_size", "control_characters", "default_start_method",
           "max_cpu_ranks", "normalize_mixed_precision", "seconds_or_none", "validate_args", "validate_call",
           "validate_cell_output", "validate_choice", "validate_cluster_launch", "validate_cluster_type",
           "validate_display_ranks", "validate_elastic_start_method", "validate_function", "validate_int",
           "validate_interrupt_grace", "validate_lines_per_second", "validate_log_dir", "validate_master_addr",
           "validate_monitor_interval", "validate_num_processes", "validate_port", "validate_rendezvous",
           "validate_seconds", "validate_start_method", "validate_text", "validate_timeout", "validate_ui",
           "validate_whole_number"]

RDZV_BACKENDS = ("static", "c10d", "etcd", "etcd-v2")
DEFAULT_LINES_PER_SECOND = NOTEBOOK_LINES_PER_SECOND   # per rank in the cell (the displays' budget)


class _DefaultPort(str):
    """The default ``use_port``: a str equal to "29500" that we can tell apart
    from a port the user chose, so only a chosen port is an error when busy."""


DEFAULT_USE_PORT = _DefaultPort(str(DEFAULT_PORT))
log = logging.getLogger("notebook_launch")


@dataclass(frozen=True)
class LaunchOptions:
    """What the user asked for, validated and resolved: the one settings object every run
    (a launch, elastic, Ray, persistent ranks) is given, instead of its fields one by one.
    Each field's default is ``notebook_launcher``'s. ``num_processes`` and ``start_method``
    may still be None here: detection (``target``) settles them.
    Build it with ``launch_options`` (which checks every value); the defaults let a caller
    such as ``start_ranks`` name only what it sets."""
    function: Callable[..., Any]
    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    num_processes: int | None = None
    mixed_precision: str = "no"
    port: int = DEFAULT_PORT
    port_is_default: bool = True   # the user left use_port alone: a busy port may be replaced
    master_addr: str = "127.0.0.1"
    node_rank: int = 0
    num_nodes: int = 1
    rdzv_backend: str = "static"
    rdzv_endpoint: str = ""
    rdzv_conf: Mapping[str, Any] | None = None
    rdzv_id: str = "none"
    max_restarts: int = 0
    poll_interval: float = 0.1   # the supervisor's tick: min(monitor_interval, 0.1)
    line_prefix: str | None = None
    start_method: StartMethod | None = None
    timeout: float | None = None
    log_dir: str | os.PathLike[str] | None = None
    ui: str | Display = "auto"   # one of UI_CHOICES, or a display the caller made
    rdzv_timeout: float | None = None   # as given; ``rendezvous_timeout`` is what every launcher uses
    display_ranks: frozenset[int] | None = frozenset({0})   # whose display() the cell shows; None: all
    stall_after: float | None = DEFAULT_STALL_AFTER   # seconds without a sign of progress: stalled
    rendezvous_timeout: float = DEFAULT_RDZV_TIMEOUT   # resolved: rdzv_timeout, rdzv_conf's, else 900 s
    lines_per_second: int | None = DEFAULT_LINES_PER_SECOND   # per rank, in the cell; None: every line
    cell_output: int | None = DEFAULT_CELL_OUTPUT   # bytes of lines the run leaves in the cell; None: all

    @property
    def elastic(self) -> bool:
        """Multi-node or restarts: torch elastic's agent runs the ranks (``elastic/``)."""
        return self.num_nodes > 1 or self.max_restarts > 0


def launch_options(*, function: Any, args: Any = (), num_processes: Any = None, mixed_precision: Any = "no",
                   use_port: Any = None, master_addr: Any = "127.0.0.1", node_rank: Any = 0,
                   num_nodes: Any = 1, rdzv_backend: Any = "static", rdzv_endpoint: Any = "",
                   rdzv_conf: Any = None, rdzv_id: Any = "none", max_restarts: Any = 0,
                   monitor_interval: Any = 0.1, log_line_prefix_template: Any = None, kwargs: Any = None,
                   start_method: Any = None, timeout: Any = None, log_dir: Any = None, ui: Any = "auto",
                   rdzv_timeout: Any = None, display_ranks: Any = None,
                   stall_after: Any = DEFAULT_STALL_AFTER,
                   lines_per_second: Any = DEFAULT_LINES_PER_SECOND, cell_output: Any = DEFAULT_CELL_OUTPUT,
                   called_as_given: Any = True) -> LaunchOptions:
    """Check every argument of ``notebook_launcher`` (each defaults to notebook_launcher's
    default; ``use_port=None`` means its default port) and resolve what depends on several
    of them; raise LaunchArgumentError naming the first bad one. Runs once per launch:
    nothing downstream checks these again. ``called_as_given``: the ranks call
    ``function(*args, **kwargs)``, so the arguments must fit its signature; False where the
    function is our own serve loop (persistent ranks), given its arguments when the ranks start."""
    if use_port is None:
        use_port = DEFAULT_USE_PORT
    validate_function(function)
    validate_args(args, kwargs)
    if num_processes is not None:
        num_processes = validate_whole_number("num_processes", num_processes)
        if num_processes < 1:
            raise LaunchArgumentError(f"num_processes must be >= 1, or None (one rank per accelerator); "
                                      f"got {num_processes}")
    mixed_precision = normalize_mixed_precision(mixed_precision)
    start_method = validate_start_method(start_method)
    validate_ui(ui)
    validate_choice("rdzv_backend", rdzv_backend, RDZV_BACKENDS)
    num_nodes = validate_int("num_nodes", num_nodes, 1)
    check_world_size(num_processes or 1, num_nodes)
    node_rank = validate_int("node_rank", node_rank, 0, num_nodes - 1)
    max_restarts = validate_int("max_restarts", max_restarts, 0)
    timeout = validate_timeout(timeout)
    stall_after = validate_timeout(stall_after, "stall_after")
    port = validate_port(use_port)
    monitor_interval = validate_monitor_interval(monitor_interval)
    parse_line_prefix(log_line_prefix_template)   # a bad template fails here, not at a rank's first line
    validate_master_addr(master_addr)
    validate_log_dir(log_dir)
    validate_text("rdzv_endpoint", rdzv_endpoint, "a 'host:port' string or ''")
    validate_text("rdzv_id", rdzv_id, "a string naming the run")
    elastic = num_nodes > 1 or max_restarts > 0
    if elastic:
        validate_elastic_start_method(start_method)
    # Every launcher that waits for ranks to meet (elastic's rendezvous, Ray's placement) waits this long.
    rendezvous_timeout = validate_rendezvous(
        rdzv_backend=rdzv_backend, rdzv_endpoint=rdzv_endpoint, rdzv_conf=rdzv_conf, rdzv_id=rdzv_id,
        rdzv_timeout=rdzv_timeout, full=elastic)
    lines_per_second = validate_lines_per_second(lines_per_second)
    cell_output = validate_cell_output(cell_output)
    display_ranks = validate_display_ranks(display_ranks)
    if called_as_given:   # last: a bad value of a parameter of ours is named before the function's arguments
        validate_call(function, args, kwargs)
    return LaunchOptions(
        function=function, args=tuple(args), kwargs=dict(kwargs or {}), num_processes=num_processes,
        mixed_precision=mixed_precision, port=port, port_is_default=isinstance(use_port, _DefaultPort),
        master_addr=master_addr, node_rank=node_rank, num_nodes=num_nodes, rdzv_backend=rdzv_backend,
        rdzv_endpoint=rdzv_endpoint, rdzv_conf=rdzv_conf, rdzv_id=rdzv_id, max_restarts=max_restarts,
        poll_interval=min(float(monitor_interval), 0.1), line_prefix=log_line_prefix_template,
        start_method=start_method, timeout=timeout, log_dir=log_dir, ui=ui, rdzv_timeout=rdzv_timeout,
        display_ranks=display_ranks, stall_after=stall_after,
        rendezvous_timeout=rendezvous_timeout, lines_per_second=lines_per_second, cell_output=cell_output)
