"""The checks of the launch options (``options.launch_options`` runs them), each beside the limits and
choices it checks against: every argument check runs before anything is detected or started, and each
error names the argument and the values that would work. Checks that need to know the machine
(num_processes against the GPUs seen) are here too and are called once detection has run (``target``).

Apart from ``options`` (the options object and how it is built) because they are a job of their own:
what a value may be, one function per argument; ``options`` imports them all, so
``from notebook_launch.planning.options import validate_x`` keeps working.
"""
from __future__ import annotations

import enum
import inspect
import logging
import math
import numbers
import operator
import os
import sys
import types
import weakref
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence, get_args

from . import fd_budget
from ..display import UI_CHOICES, Display
from ..display.cell_budget import MIN_CELL_OUTPUT
from ..errors import LaunchArgumentError
from ..wire.plan import DeviceKind, StartMethod, available_cpus

if TYPE_CHECKING:
    from .options import LaunchOptions

MIXED_PRECISION_CHOICES = ("no", "fp16", "bf16", "fp8")
START_METHODS: tuple[StartMethod, ...] = get_args(StartMethod)
DEFAULT_RDZV_TIMEOUT = 900.0      # seconds, as torch.distributed.launcher.api.LaunchConfig
MAX_WORLD_SIZE = 2**31 - 1   # torch numbers ranks and sizes its TCPStore with C ints
log = logging.getLogger("notebook_launch")


def validate_cell_output(value: object) -> int | None:
    """``cell_output``: the bytes of output lines a run leaves in its cell (``display.cell_budget``;
    the rest are in the ranks' log files); "all" keeps every line there (returned as None)."""
    if value == "all" and isinstance(value, str):
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) < MIN_CELL_OUTPUT:
        raise LaunchArgumentError(
            f"cell_output must be a whole number of bytes >= {MIN_CELL_OUTPUT:,} (what the run's output lines "
            f"may take in the cell; the rest are in the ranks' log files) or 'all' for every line; got {value!r:.80}")
    return int(value)


def validate_lines_per_second(value: object) -> int | None:
    """``lines_per_second``: how many of each rank's output lines a second the cell shows, on each
    of its two streams (the rest go to the rank's log); "all" shows every line (returned as None)."""
    if value == "all" and isinstance(value, str):
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) < 1:
        raise LaunchArgumentError(
            f"lines_per_second must be a whole number >= 1 (lines a second per rank shown in the cell; "
            f"the rest are in the rank's log) or 'all' for every line; got {value!r}")
    return int(value)


def validate_start_method(value: object) -> StartMethod | None:
    """The user's start_method as the launch's type (None: the default for where it runs)."""
    validate_choice("start_method", value, (None, *START_METHODS))
    return next((method for method in START_METHODS if method == value), None)


def default_start_method() -> StartMethod:
    """fork where it is safe (Linux); spawn elsewhere: Windows has no fork, and macOS
    system frameworks crash in forked children (CPython defaults to spawn there too)."""
    return "fork" if hasattr(os, "fork") and sys.platform.startswith("linux") else "spawn"


def validate_elastic_start_method(start_method: StartMethod | None) -> None:
    """The elastic agent keys ranks by process; xmp.spawn runs several ranks per process."""
    if start_method == "xla":
        raise LaunchArgumentError(
            "start_method='xla' cannot be combined with num_nodes > 1 or max_restarts > 0: torch_xla "
            "runs several ranks per process, which torch elastic's agent cannot restart or watch. "
            "Launch on one node with max_restarts=0, or use start_method='fork' or 'spawn'.")


def validate_function(function: object) -> None:
    if not callable(function):
        raise LaunchArgumentError(
            f"function must be callable (e.g. a function defined in a cell); got "
            f"{type(function).__name__}: {function!r:.80}")


def validate_args(args: object, kwargs: object) -> None:
    if not isinstance(args, (tuple, list)):
        raise LaunchArgumentError(
            f"args must be a tuple or list of positional arguments for the function; got "
            f"{type(args).__name__}. For a single argument write args=(value,).")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise LaunchArgumentError(f"kwargs must be a dict or None; got {type(kwargs).__name__}")
    # Python's own rule for f(**kwargs): str keys (a function taking **kwargs accepts any str;
    # validate_call checks the rest against the signature)
    not_names = [key for key in kwargs or {} if not isinstance(key, str)]
    if not_names:
        raise LaunchArgumentError(
            f"kwargs must map parameter names (strings such as 'lr') to values; not a parameter name: "
            f"{', '.join(map(repr, not_names))}")


def validate_call(function: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any] | None) -> None:
    """``function(*args, **kwargs)`` fits the function's signature, checked here rather than as a
    TypeError in every rank after they all started. A signature that cannot be read (some
    functions written in C) is not checked; a wrapper (``functools.wraps``) is checked as the
    wrapper's own signature, never as the wrapped function's (a decorator may add or remove
    arguments, so the wrapped signature could refuse a call that works)."""
    try:
        signature, fits = _signature(function)
    except (TypeError, ValueError):
        return
    shape = (len(args), tuple(kwargs) if kwargs else ())   # all that binding looks at: no value
    if shape in fits:
        return
    try:
        signature.bind(*args, **(kwargs or {}))
    except TypeError as err:
        name = getattr(function, "__qualname__", None) or type(function).__name__
        raise LaunchArgumentError(
            f"{name}{signature} cannot be called with args={tuple(args)!r:.200} and "
            f"kwargs={dict(kwargs or {})!r:.200}: "
            f"{err}. Pass the function's parameters in args=(...) (in order) or kwargs={{'name': value}}; "
            f"nothing was started") from None
    if len(fits) < 8:
        fits.add(shape)


_Kept = tuple[tuple, inspect.Signature, set]
_signatures: weakref.WeakKeyDictionary[Callable[..., Any], _Kept] = weakref.WeakKeyDictionary()


def _signature(function: Callable[..., Any]) -> tuple[inspect.Signature, set]:
    """``inspect.signature(function, follow_wrapped=False)`` and the shapes of the calls known to
    fit it (positional count, keyword names: binding looks at nothing else); a plain function's are
    kept while its code, defaults and ``__signature__`` are the same objects (a warm
    ``ranks.run(f)`` spent a twentieth of the notebook's CPU reading the same signature again, and
    binding the same empty call, issue 45). Anything it could have changed with is in the key: a
    cell run again makes a new function, a new code object."""
    if not isinstance(function, types.FunctionType):
        return inspect.signature(function, follow_wrapped=False), set()
    key = (function.__code__, function.__defaults__, function.__kwdefaults__,
           function.__dict__.get("__signature__"), function.__dict__.get("__text_signature__"))
    kept = _signatures.get(function)
    if kept is not None and len(kept[0]) == len(key) and all(a is b for a, b in zip(kept[0], key)):
        return kept[1], kept[2]
    signature = inspect.signature(function, follow_wrapped=False)
    _signatures[function] = (key, signature, set())
    return signature, _signatures[function][2]


def normalize_mixed_precision(value: object) -> str:
    if isinstance(value, enum.Enum):   # Accelerate's PrecisionType.BF16 and the like
        value = value.value
    if value is not None and not isinstance(value, str):
        raise LaunchArgumentError(f"mixed_precision must be a string, one of {', '.join(MIXED_PRECISION_CHOICES)}; "
                                  f"got {type(value).__name__}: {value!r:.80}")
    text = "no" if value is None else value.strip().lower()
    if text not in MIXED_PRECISION_CHOICES:
        raise LaunchArgumentError(
            f"mixed_precision={value!r} is not valid; choose one of {', '.join(MIXED_PRECISION_CHOICES)}")
    return text


def validate_whole_number(name: str, value: object) -> int:
    """Any integral number (int, NumPy's int64, ...), as Accelerate accepts; not a bool or a float."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise LaunchArgumentError(
            f"{name} must be a whole number >= 1 or None (one rank per accelerator); got {value!r}")
    return int(value)


def max_cpu_ranks(cpus: int | None = None) -> int:
    """The most CPU ranks one machine runs: beyond 8 per core they only time-slice the same
    cores (each is a whole process with its pipes and log file); 64 at least."""
    return max(64, 8 * (cpus or available_cpus()))


def validate_num_processes(num_processes: object, device_kind: DeviceKind, device_count: int) -> int:
    """num_processes against what detection found (CUDA GPUs limit it)."""
    count = validate_whole_number("num_processes", num_processes)
    if count < 1:
        raise LaunchArgumentError(f"num_processes must be >= 1; got {count}")
    if device_kind == "cpu" and count > max_cpu_ranks():
        raise LaunchArgumentError(
            f"num_processes={count} CPU ranks is more than this machine can run usefully: at most "
            f"{max_cpu_ranks()} ({available_cpus()} CPU cores, 8 ranks per core, 64 at least). Use fewer ranks.")
    if device_kind == "cuda" and count > device_count:
        raise LaunchArgumentError(
            f"num_processes={count} is more than the {device_count} CUDA GPU(s) visible here; "
            f"use num_processes between 1 and {device_count} (or None for all of them)")
    return count


def check_world_size(num_processes: int, num_nodes: int) -> None:
    """Every rank of every node: torch's process groups and TCPStore count them in a C int, and
    a larger world failed inside TCPStore's constructor (num_nodes=2**40 was accepted)."""
    if num_processes * num_nodes > MAX_WORLD_SIZE:
        raise LaunchArgumentError(
            f"num_processes={num_processes} on each of num_nodes={num_nodes} makes "
            f"{num_processes * num_nodes} ranks, more than torch.distributed can number ({MAX_WORLD_SIZE}); "
            f"pass the number of machines as num_nodes and the ranks on each as num_processes")


def validate_int(name: str, value: object, minimum: int, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise LaunchArgumentError(f"{name} must be a whole number; got {value!r}")
    value = int(value)
    if value < minimum or (maximum is not None and value > maximum):
        bounds = f">= {minimum}" if maximum is None else f"between {minimum} and {maximum}"
        raise LaunchArgumentError(f"{name} must be {bounds}; got {value}")
    return value


def validate_port(use_port: object) -> int:
    """A whole number (not a bool) or a string of ASCII digits, 1 to 65535."""
    port = 0
    if isinstance(use_port, numbers.Integral) and not isinstance(use_port, bool):
        port = int(use_port)
    elif isinstance(use_port, str) and use_port.strip().isascii() and use_port.strip().isdigit():
        port = int(use_port)
    if not 1 <= port <= 65535:
        raise LaunchArgumentError(f"use_port must be a TCP port number between 1 and 65535; got {use_port!r}")
    return port


def seconds_or_none(value: object) -> float | None:
    """``value`` as seconds when it is a real number > 0 (NaN is not: every comparison with
    it is False; a bool is not either), else None."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    seconds = float(value)
    return seconds if seconds > 0 else None


def validate_timeout(timeout: object, name: str = "timeout") -> float | None:
    """Seconds > 0; float("inf") means none, as None does."""
    if timeout is None:
        return None
    seconds = seconds_or_none(timeout)
    if seconds is None:
        raise LaunchArgumentError(f"{name} must be a number of seconds > 0, or None; got {timeout!r}")
    return None if math.isinf(seconds) else seconds


def validate_monitor_interval(value: object) -> float:
    seconds = seconds_or_none(value)
    if seconds is None or math.isinf(seconds):
        raise LaunchArgumentError(f"monitor_interval must be a finite number of seconds > 0; got {value!r}")
    return seconds


def validate_seconds(name: str, value: object, meaning: str) -> float:
    """A finite number of seconds > 0 (not NaN, inf, a bool or a string); ``meaning`` says what they are for."""
    seconds = seconds_or_none(value)
    if seconds is None or math.isinf(seconds):
        raise LaunchArgumentError(f"{name} must be a finite number of seconds > 0 ({meaning}); got {value!r}")
    return seconds


def validate_interrupt_grace(value: object) -> float:
    """``interrupt_grace`` of persistent ranks: a call that timed out or was interrupted waits this
    long for its ranks, so it must end (NaN or inf would wait forever, and every other caller behind it)."""
    return validate_seconds("interrupt_grace", value,
                            "how long interrupted ranks have to come back before every rank is stopped")


def control_characters(text: str) -> list[str]:
    """The characters of ``text`` no name or path can hold: NUL, line breaks, other controls."""
    return sorted({repr(ch) for ch in text if not ch.isprintable() and ch != " "})


def validate_text(name: str, value: object, what: str) -> None:
    """A str without control characters (NUL ends the string in C: the ranks would use a different one)."""
    if not isinstance(value, str):
        raise LaunchArgumentError(f"{name} must be {what}; got {type(value).__name__}: {value!r:.80}")
    bad = control_characters(value)
    if bad:
        raise LaunchArgumentError(f"{name}={value!r:.80} holds control characters ({', '.join(bad)}); "
                                  f"it must be {what}")


def validate_master_addr(master_addr: object) -> None:
    what = "a host name or IP address of node 0, such as '127.0.0.1' (the default) or '10.0.0.1'"
    if not isinstance(master_addr, str) or not master_addr.strip():
        raise LaunchArgumentError(f"master_addr must be {what}; got {master_addr!r}")
    validate_text("master_addr", master_addr, what)
    if master_addr != master_addr.strip() or " " in master_addr:
        raise LaunchArgumentError(f"master_addr={master_addr!r} holds spaces; it must be {what}")


def validate_log_dir(log_dir: object) -> None:
    """A path (str or os.PathLike) or None; "" would mean the working directory, never wanted."""
    if log_dir is None:
        return
    path = os.fspath(log_dir) if isinstance(log_dir, (str, os.PathLike)) else None
    if not isinstance(path, str) or not path.strip():
        raise LaunchArgumentError(
            f"log_dir must be a folder path or None (a new folder per run in the user cache); got {log_dir!r}")
    if "\0" in path:
        raise LaunchArgumentError(f"log_dir={path!r} holds a NUL character, which no path can; pass a folder path")


def validate_display_ranks(value: object) -> frozenset[int] | None:
    """``display_ranks``: whose display() calls the cell shows. None means rank 0 (what a
    single process would show), "all" every rank (returned as None), else one or more ranks."""
    if value is None:
        return frozenset({0})
    if isinstance(value, str):
        if value == "all":
            return None
        raise LaunchArgumentError(f"display_ranks={value!r} is not valid; pass 'all', a rank or a list of "
                                  f"ranks such as [0, 1], or None for rank 0")
    items = list(value) if isinstance(value, Iterable) else [value]
    ranks = set()
    for item in items:
        if isinstance(item, bool) or not hasattr(item, "__index__") or operator.index(item) < 0:
            raise LaunchArgumentError(f"display_ranks={value!r}: {item!r} is not a rank; pass whole numbers "
                                      f">= 0 (global ranks), 'all', or None for rank 0")
        ranks.add(operator.index(item))
    if not ranks:
        raise LaunchArgumentError("display_ranks=[] would hide every rank's display(); pass a rank such "
                                  "as [0], 'all', or None for rank 0")
    return frozenset(ranks)


def check_display_ranks_exist(ranks: frozenset[int] | None, world_size: int) -> None:
    """Every rank named in ``display_ranks`` exists in the run (known once the world size is)."""
    missing = sorted(rank for rank in ranks or () if rank >= world_size)
    if missing:
        raise LaunchArgumentError(
            f"display_ranks names rank {missing[0]}, but this run has {world_size} rank"
            f"{'s' if world_size != 1 else ''} (0 to {world_size - 1}); pass ranks in that range, or 'all'")


def validate_ui(ui: object) -> None:
    """``ui``: one of ``UI_CHOICES``, or a ``Display`` instance (a display of the caller's own,
    driven as the run's: ``display.base.Display`` says what it is called with)."""
    if isinstance(ui, Display):
        return
    if ui not in UI_CHOICES:
        shown = ", ".join(repr(c) for c in UI_CHOICES)
        raise LaunchArgumentError(f"ui={ui!r} is not valid; choose one of {shown}, or pass a display of your "
                                  f"own (an instance of notebook_launch.display.Display)")


def validate_choice(name: str, value: object, choices: Sequence[object]) -> None:
    if value not in choices:
        shown = ", ".join(repr(c) for c in choices)
        raise LaunchArgumentError(f"{name}={value!r} is not valid; choose one of {shown}")


def validate_rendezvous(*, rdzv_backend: str, rdzv_endpoint: object, rdzv_conf: object, rdzv_id: object,
                        rdzv_timeout: object, full: bool = True) -> float:
    """Check the rendezvous arguments and return the rendezvous timeout: rdzv_timeout, else
    rdzv_conf's "join_timeout"/"timeout", else torch elastic's 900 s. ``full``: a rendezvous
    runs (multi-node or restarts), so rdzv_endpoint and rdzv_id are checked too; otherwise only
    what the timeout is made of (Ray waits that long for its placement)."""
    if rdzv_conf is not None and not isinstance(rdzv_conf, dict):
        raise LaunchArgumentError(
            f"rdzv_conf must be a dict of rendezvous options such as {{'join_timeout': 600}} or None; "
            f"got {type(rdzv_conf).__name__}")
    not_names = [key for key in rdzv_conf or {} if not isinstance(key, str) or not key or control_characters(key)]
    if not_names:
        raise LaunchArgumentError(f"rdzv_conf must map option names (strings such as 'join_timeout') to values; "
                                  f"not an option name: {', '.join(map(repr, not_names))}")
    if full and not isinstance(rdzv_endpoint, str):
        raise LaunchArgumentError(f"rdzv_endpoint must be a 'host:port' string or ''; got {rdzv_endpoint!r}")
    if full and (not isinstance(rdzv_id, str) or not rdzv_id):
        raise LaunchArgumentError(f"rdzv_id must be a non-empty string naming the run; got {rdzv_id!r}")
    if rdzv_timeout is not None:
        seconds = seconds_or_none(rdzv_timeout)
        if seconds is None or math.isinf(seconds):
            raise LaunchArgumentError(
                f"rdzv_timeout must be a number of seconds > 0 (how long to wait for every node); "
                f"got {rdzv_timeout!r}")
        return seconds
    config = rdzv_conf or {}
    for key in ("join_timeout", "timeout"):
        if key in config:
            given = config[key]
            try:   # a number, or its text as torchrun's --rdzv-conf gives it
                value = float(given) if not isinstance(given, bool) else math.nan
            except (TypeError, ValueError):
                value = math.nan
            if not 0 < value < math.inf:
                raise LaunchArgumentError(f"rdzv_conf[{key!r}] must be a number of seconds, finite and > 0; "
                                          f"got {given!r}") from None
            return value
    return DEFAULT_RDZV_TIMEOUT


# --- cluster=RayCluster(...) ----------------------------------------------------------------

def validate_cluster_type(cluster: object, cluster_type: type | tuple[type, ...]) -> None:
    if not isinstance(cluster, cluster_type):
        raise LaunchArgumentError(
            f"cluster must be a notebook_launch.RayCluster(...), a notebook_launch.SlurmCluster(...) or None; "
            f"got {type(cluster).__name__}")


def validate_cluster_launch(options: LaunchOptions) -> int:
    """The notebook_launcher arguments that a launch on a cluster cannot honour, and room in this
    process for the connections every rank makes back; returns the number of ranks (num_processes
    is the world size there)."""
    if options.num_nodes != 1 or options.node_rank != 0 or options.rdzv_endpoint:
        raise LaunchArgumentError(
            "with cluster=RayCluster(...) or SlurmCluster(...) the cluster places the ranks on its nodes: "
            "leave num_nodes, node_rank "
            "and rdzv_endpoint at their defaults and give num_processes as the total number of ranks")
    if options.start_method is not None:
        raise LaunchArgumentError(
            f"start_method={options.start_method!r} cannot be combined with cluster=: ranks on a "
            f"cluster receive the function with cloudpickle in a fresh interpreter; leave start_method unset")
    count = options.num_processes
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise LaunchArgumentError(
            f"with cluster=, num_processes must be the total number of ranks (a whole number >= 1); "
            f"got {count!r}")
    check_world_size(count, 1)
    note = fd_budget.ensure_fd_budget(fd_budget.cluster_need(count))   # every rank connects back here
    if note:
        log.info("notebook_launch: %s", note)
    return count
