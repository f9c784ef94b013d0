"""Pre-flight checks, run before any process starts. Each raises GuardError
(or LaunchArgumentError) with what happened and what to do about it."""
from __future__ import annotations

import sys

from . import cuda_tracking
from .environment import inside_launched_rank
from .errors import GuardError, LaunchArgumentError
from .plan import MIXED_PRECISION_CHOICES


def check_not_inside_rank() -> None:
    """A launch from inside a launched rank would nest process groups and deadlock."""
    if inside_launched_rank():
        raise GuardError(
            "notebook_launcher was called from inside a launched rank. The function you launch "
            "already runs on every rank: call the training code directly there instead of "
            "launching again.")


def check_no_accelerate_state() -> None:
    """Forked ranks would inherit an existing Accelerate state and each run as a lone rank 0.
    Accelerate's own guard misses a bare PartialState (FIELD_NOTES)."""
    if "accelerate" not in sys.modules:
        return
    try:
        from accelerate.state import AcceleratorState, PartialState
    except Exception:
        return
    found = []
    if getattr(AcceleratorState, "_shared_state", None):
        found.append("an Accelerator or AcceleratorState")
    if getattr(PartialState, "_shared_state", None) and not found:
        found.append("a PartialState")
    if found:
        raise GuardError(
            f"This notebook already holds {found[0]} (created outside the launched function). "
            "Every rank would inherit it and train alone as rank 0. Create the Accelerator inside "
            "the function you pass to notebook_launcher, then restart the kernel (or call "
            "accelerate.state.AcceleratorState._reset_state(True) if it touched no GPU) and launch again.")


def check_cuda_not_initialized(start_method: str) -> None:
    """Forking a process that holds a CUDA context gives children a broken CUDA."""
    if start_method != "fork" or not cuda_tracking.is_cuda_initialized():
        return
    where = cuda_tracking.where()
    raise GuardError(
        "CUDA is already initialized in this notebook, so ranks cannot be forked from it "
        "(their CUDA would be unusable)."
        + (f"\n{where}\n" if where else " ")
        + "What to do: restart the kernel and keep every CUDA call (.cuda(), .to('cuda'), "
        "torch.cuda.* queries that create a context, an Accelerator) inside the launched function; "
        "or pass start_method='spawn' so ranks start fresh (the function and its arguments are then "
        "shipped with cloudpickle). Tip: `import notebook_launch` or `%load_ext notebook_launch` "
        "early in the notebook to record where CUDA gets initialized.")


def validate_function(function) -> None:
    if not callable(function):
        raise LaunchArgumentError(
            f"function must be callable (e.g. a function defined in a cell); got "
            f"{type(function).__name__}: {function!r:.80}")


def validate_args(args, kwargs) -> None:
    if not isinstance(args, (tuple, list)):
        raise LaunchArgumentError(
            f"args must be a tuple or list of positional arguments for the function; got "
            f"{type(args).__name__}. For a single argument write args=(value,).")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise LaunchArgumentError(f"kwargs must be a dict or None; got {type(kwargs).__name__}")


def normalize_mixed_precision(value) -> str:
    text = "no" if value is None else str(value).lower()
    if text not in MIXED_PRECISION_CHOICES:
        raise LaunchArgumentError(
            f"mixed_precision={value!r} is not valid; choose one of {', '.join(MIXED_PRECISION_CHOICES)}")
    return text


def validate_num_processes(num_processes, device_kind: str, device_count: int) -> int:
    if isinstance(num_processes, bool) or not isinstance(num_processes, int):
        raise LaunchArgumentError(
            f"num_processes must be a whole number >= 1 or None (one rank per accelerator); "
            f"got {num_processes!r}")
    if num_processes < 1:
        raise LaunchArgumentError(f"num_processes must be >= 1; got {num_processes}")
    if device_kind == "cuda" and num_processes > device_count:
        raise LaunchArgumentError(
            f"num_processes={num_processes} is more than the {device_count} CUDA GPU(s) visible here; "
            f"use num_processes between 1 and {device_count} (or None for all of them)")
    return num_processes


def validate_int(name: str, value, minimum: int, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise LaunchArgumentError(f"{name} must be a whole number; got {value!r}")
    if value < minimum or (maximum is not None and value > maximum):
        bounds = f">= {minimum}" if maximum is None else f"between {minimum} and {maximum}"
        raise LaunchArgumentError(f"{name} must be {bounds}; got {value}")
    return value


def validate_port(use_port) -> int:
    try:
        port = int(str(use_port))
    except (TypeError, ValueError):
        port = -1
    if not 1 <= port <= 65535:
        raise LaunchArgumentError(f"use_port must be a TCP port number between 1 and 65535; got {use_port!r}")
    return port


def validate_timeout(timeout):
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise LaunchArgumentError(f"timeout must be a number of seconds > 0, or None; got {timeout!r}")
    return float(timeout)


def validate_choice(name: str, value, choices) -> None:
    if value not in choices:
        shown = ", ".join(repr(c) for c in choices)
        raise LaunchArgumentError(f"{name}={value!r} is not valid; choose one of {shown}")
