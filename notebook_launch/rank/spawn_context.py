"""What a spawned rank needs from the notebook, packed in the parent and
restored in the rank before the user's function runs.

A forked rank inherits all of this for free; a spawned rank starts as a fresh
interpreter, so we ship: the job (function, args, kwargs) pickled with
cloudpickle, the working directory, ``sys.path``, the source of notebook
cells (for tracebacks), torch's determinism and
precision flags, and the random states of ``random``, NumPy and torch (CPU),
so a rank starts where a forked one would. CUDA state is never read here:
reading it could initialize CUDA in the notebook.
"""
from __future__ import annotations

import logging
import os
import pickle
import sys
from typing import Any, Callable, Iterable

from ..wire import pickling, shared_tensors
from ..errors.best_effort import best_effort
from ..errors import LaunchArgumentError

log = logging.getLogger("notebook_launch")

MAX_CELL_SOURCE_BYTES = 8 << 20


def build_payload(job: Any, specs: Iterable[Any], tensors_fd: int | None = None) -> bytes:
    """Bytes for the spawned ranks: the cloudpickled job plus the parent's context.
    The bytes of the job's tensors go to ``tensors_fd`` (see shared_tensors)."""
    job_bytes = pickle_job(job, tensors_fd)
    return pickle.dumps({
        "context": capture_context(),
        "specs": {spec.local_rank: spec for spec in specs},
        "job": job_bytes,
    }, protocol=pickle.HIGHEST_PROTOCOL)


def pickle_job(job: Any, tensors_fd: int | None = None) -> bytes:
    """cloudpickle the job; on failure name the part that cannot be shipped (its path inside
    the argument: ``args[0]["log"]``) and what to do. An open file or socket is refused
    (``pickling``): cloudpickle would send a read-mode text file as a copy of its contents."""
    _refuse_device_tensors(job)
    try:
        return shared_tensors.dumps(job, tensors_fd)
    except Exception as exc:
        culprit, reason = _unpicklable_part(job, exc)
        raise LaunchArgumentError(
            f"start_method='spawn' sends the function and its arguments to each rank with "
            f"cloudpickle, but {culprit} cannot be pickled ({reason}). "
            f"Create such objects (locks, open files, sockets, generators, DataLoaders, CUDA tensors, "
            f"database connections) inside the launched function instead of passing them in, "
            f"or use start_method='fork' where it is safe.") from exc


def _job_parts(job: Any) -> list[tuple[str, Any]]:
    parts = [("the function", job.function)]
    parts += [(f"args[{i}]", a) for i, a in enumerate(job.args)]
    parts += [(f"kwargs[{k!r}]", v) for k, v in (job.kwargs or {}).items()]
    return parts


def _refuse_device_tensors(job: Any) -> None:
    """A tensor on an accelerator in the function or its arguments would reach each rank as a CPU
    copy (a rank cannot share the notebook's GPU memory), and a model the user put on the GPU
    would silently train on the CPU: refuse it before anything starts, naming where it is."""
    if "torch" not in sys.modules:
        return
    for name, value in _job_parts(job):
        found = pickling.locate(value, name, refuse_devices=True)
        if found is None or not isinstance(found[2], pickling.DeviceTensorError):
            continue
        path, _part, error = found
        raise LaunchArgumentError(
            f"{path} is {error}, but the ranks of this launch are fresh processes (start_method='spawn', "
            f"or a notebook that holds CUDA): each would get a CPU copy, never the notebook's GPU memory. "
            f"What to do: create it inside the launched function, or pass it on the CPU (`.cpu()`, "
            f"`model.to('cpu')`) and move it to the rank's device there "
            f"(`.to(f\"cuda:{{os.environ['LOCAL_RANK']}}\")`, or let an Accelerator do it).")


def _unpicklable_part(job: Any, exc: Exception) -> tuple[str, str]:
    """(the path of the innermost part that does not pickle, with its type; why)."""
    for name, value in _job_parts(job):
        found = pickling.locate(value, name)
        if found is not None:
            path, part, error = found
            return f"{path} ({type(part).__module__}.{type(part).__qualname__})", f"{type(error).__name__}: {error}"
    return "the job", f"{type(exc).__name__}: {exc}"


def capture_context() -> dict[str, Any]:
    """The notebook's state that a rank should start with. Plain data only."""
    try:
        cwd = os.getcwd()
    except OSError:
        log.debug("the working directory is gone; ranks keep theirs")
        cwd = None
    context: dict[str, Any] = {"cwd": cwd, "sys_path": list(sys.path), "random_state": None,
               "numpy_state": None, "torch": None, "cell_sources": cell_sources()}
    import random
    context["random_state"] = random.getstate()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        with best_effort("numpy's random state is not shipped to the ranks"):
            name, keys, pos, has_gauss, cached = numpy.random.get_state()
            context["numpy_state"] = (name, keys.tolist(), pos, has_gauss, cached)
    if "torch" in sys.modules:
        context["torch"] = _torch_settings(sys.modules["torch"])
    return context


def cell_sources(limit: int = MAX_CELL_SOURCE_BYTES) -> dict[str, list[str]]:
    """Source lines of code that exists only in memory (notebook cells: IPython keeps them
    in linecache without a file), so a rank's traceback shows the failing line."""
    import linecache
    cells = getattr(linecache, "_ipython_cache", {})   # IPython 7 stamps its cells with a time, not None
    sources: dict[str, list[str]] = {}
    total = 0
    for filename, entry in list(linecache.cache.items()):
        if len(entry) != 4 or (entry[1] is not None and filename not in cells):  # no file to reread
            continue
        size = sum(len(line) for line in entry[2])
        if total + size > limit:
            break
        sources[filename] = list(entry[2])
        total += size
    return sources


def _torch_flags(torch: Any) -> dict[str, tuple[Callable[[], Any], Callable[[Any], Any]]]:
    """name -> (getter, setter) for the torch settings a forked rank would inherit."""
    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul

    def attr(obj: Any, name: str) -> tuple[Callable[[], Any], Callable[[Any], Any]]:
        return (lambda: getattr(obj, name)), (lambda v: setattr(obj, name, v))

    return {
        "deterministic": (
            lambda: (torch.are_deterministic_algorithms_enabled(),
                     torch.is_deterministic_algorithms_warn_only_enabled()),
            lambda v: torch.use_deterministic_algorithms(v[0], warn_only=v[1])),
        "float32_matmul_precision": (torch.get_float32_matmul_precision,
                                     torch.set_float32_matmul_precision),
        "default_dtype": (lambda: str(torch.get_default_dtype()).replace("torch.", ""),
                          lambda v: torch.set_default_dtype(getattr(torch, v))),
        "cudnn_deterministic": attr(cudnn, "deterministic"),
        "cudnn_benchmark": attr(cudnn, "benchmark"),
        "cudnn_allow_tf32": attr(cudnn, "allow_tf32"),
        "cuda_matmul_allow_tf32": attr(matmul, "allow_tf32"),
        "cpu_rng_state": (lambda: bytes(torch.get_rng_state().tolist()),
                          lambda v: torch.set_rng_state(torch.frombuffer(bytearray(v), dtype=torch.uint8))),
    }


def _torch_settings(torch: Any) -> dict[str, Any]:
    settings = {}
    for key, (getter, _) in _torch_flags(torch).items():
        # e.g. torch refuses to read a flag set through mixed old/new APIs
        with best_effort("torch setting %s is not shipped to the ranks", key):
            settings[key] = getter()
    return settings


def restore_paths(context: dict[str, Any]) -> None:
    """Working directory and sys.path first: unpickling the job may import the user's modules."""
    if context.get("cwd"):
        try:
            os.chdir(context["cwd"])
        except OSError:
            log.debug("the notebook's working directory %s is not reachable here", context["cwd"])
    parent_path = list(context.get("sys_path") or [])
    sys.path[:] = parent_path + [p for p in sys.path if p not in parent_path]
    import linecache
    for filename, lines in (context.get("cell_sources") or {}).items():
        linecache.cache[filename] = (sum(map(len, lines)), None, lines, filename)


def restore_state(context: dict[str, Any]) -> None:
    """Random states and torch flags, just before the function runs."""
    import random
    if context.get("random_state") is not None:
        random.setstate(context["random_state"])
    if context.get("numpy_state") is not None:
        with best_effort("numpy's random state was not restored"):
            import numpy
            name, keys, pos, has_gauss, cached = context["numpy_state"]
            numpy.random.set_state((name, numpy.array(keys, dtype=numpy.uint32), pos, has_gauss, cached))
    if context.get("torch") is not None:
        import torch
        _restore_torch(torch, context["torch"])


def _restore_torch(torch: Any, settings: dict[str, Any]) -> None:
    """Set only what differs from a fresh interpreter, so torch's legacy and new
    precision APIs are not mixed (torch then refuses to read them)."""
    for key, (getter, setter) in _torch_flags(torch).items():
        if key not in settings:
            continue
        with best_effort("torch setting %s was not restored", key):
            if getter() != settings[key]:
                setter(settings[key])
