"""What a spawned rank needs from the notebook, packed in the parent and
restored in the rank before the user's function runs.

A forked rank inherits all of this for free; a spawned rank starts as a fresh
interpreter, so we ship: the job (function, args, kwargs) pickled with
cloudpickle, the working directory, ``sys.path``, torch's determinism and
precision flags, and the random states of ``random``, NumPy and torch (CPU),
so a rank starts where a forked one would. CUDA state is never read here:
reading it could initialize CUDA in the notebook.
"""
from __future__ import annotations

import os
import pickle
import sys

from .errors import LaunchArgumentError

FORMAT_VERSION = 1


def build_payload(job, specs) -> bytes:
    """Bytes for the spawned ranks: the cloudpickled job plus the parent's context."""
    job_bytes = pickle_job(job)
    return pickle.dumps({
        "version": FORMAT_VERSION,
        "context": capture_context(),
        "specs": {spec.local_rank: spec for spec in specs},
        "job": job_bytes,
    }, protocol=pickle.HIGHEST_PROTOCOL)


def pickle_job(job) -> bytes:
    """cloudpickle the job; on failure name the part that cannot be shipped and what to do."""
    import cloudpickle
    try:
        return cloudpickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        culprit = _unpicklable_part(job, cloudpickle)
        raise LaunchArgumentError(
            f"start_method='spawn' sends the function and its arguments to each rank with "
            f"cloudpickle, but {culprit} cannot be pickled ({type(exc).__name__}: {exc}). "
            f"Create such objects (locks, open files, generators, DataLoaders, CUDA tensors, "
            f"database connections) inside the launched function instead of passing them in, "
            f"or use start_method='fork' where it is safe.") from exc


def _unpicklable_part(job, cloudpickle) -> str:
    parts = [("the function", job.function)]
    parts += [(f"args[{i}]", a) for i, a in enumerate(job.args)]
    parts += [(f"kwargs[{k!r}]", v) for k, v in (job.kwargs or {}).items()]
    for name, value in parts:
        try:
            cloudpickle.dumps(value)
        except Exception:
            return f"{name} ({type(value).__module__}.{type(value).__qualname__})"
    return "the job"


def capture_context() -> dict:
    """The notebook's state that a rank should start with. Plain data only."""
    try:
        cwd = os.getcwd()
    except OSError:
        cwd = None
    context = {"cwd": cwd, "sys_path": list(sys.path), "random_state": None,
               "numpy_state": None, "torch": None}
    import random
    context["random_state"] = random.getstate()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        try:
            name, keys, pos, has_gauss, cached = numpy.random.get_state()
            context["numpy_state"] = (name, keys.tolist(), pos, has_gauss, cached)
        except Exception:
            pass
    if "torch" in sys.modules:
        context["torch"] = _torch_settings(sys.modules["torch"])
    return context


def _torch_settings(torch) -> dict:
    settings = {}
    getters = {
        "deterministic": torch.are_deterministic_algorithms_enabled,
        "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled,
        "float32_matmul_precision": torch.get_float32_matmul_precision,
        "default_dtype": lambda: str(torch.get_default_dtype()).replace("torch.", ""),
        "cudnn_deterministic": lambda: torch.backends.cudnn.deterministic,
        "cudnn_benchmark": lambda: torch.backends.cudnn.benchmark,
        "cudnn_allow_tf32": lambda: torch.backends.cudnn.allow_tf32,
        "cuda_matmul_allow_tf32": lambda: torch.backends.cuda.matmul.allow_tf32,
        "cpu_rng_state": lambda: bytes(torch.get_rng_state().tolist()),
    }
    for key, getter in getters.items():
        try:
            settings[key] = getter()
        except Exception:
            pass
    return settings


def restore_paths(context: dict) -> None:
    """Working directory and sys.path first: unpickling the job may import the user's modules."""
    if context.get("cwd"):
        try:
            os.chdir(context["cwd"])
        except OSError:
            pass
    parent_path = list(context.get("sys_path") or [])
    sys.path[:] = parent_path + [p for p in sys.path if p not in parent_path]


def restore_state(context: dict) -> None:
    """Random states and torch flags, just before the function runs."""
    import random
    if context.get("random_state") is not None:
        random.setstate(context["random_state"])
    if context.get("numpy_state") is not None:
        try:
            import numpy
            name, keys, pos, has_gauss, cached = context["numpy_state"]
            numpy.random.set_state((name, numpy.array(keys, dtype=numpy.uint32), pos, has_gauss, cached))
        except Exception:
            pass
    if context.get("torch") is not None:
        import torch
        _restore_torch(torch, context["torch"])


def _restore_torch(torch, settings: dict) -> None:
    setters = {
        "deterministic": lambda v: torch.use_deterministic_algorithms(
            v, warn_only=settings.get("deterministic_warn_only", False)),
        "float32_matmul_precision": torch.set_float32_matmul_precision,
        "default_dtype": lambda v: torch.set_default_dtype(getattr(torch, v)),
        "cudnn_deterministic": lambda v: setattr(torch.backends.cudnn, "deterministic", v),
        "cudnn_benchmark": lambda v: setattr(torch.backends.cudnn, "benchmark", v),
        "cudnn_allow_tf32": lambda v: setattr(torch.backends.cudnn, "allow_tf32", v),
        "cuda_matmul_allow_tf32": lambda v: setattr(torch.backends.cuda.matmul, "allow_tf32", v),
        "cpu_rng_state": lambda v: torch.set_rng_state(torch.frombuffer(bytearray(v), dtype=torch.uint8)),
    }
    for key, setter in setters.items():
        if key in settings:
            try:
                setter(settings[key])
            except Exception:
                pass
