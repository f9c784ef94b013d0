"""How rank processes start: fork, spawn (fresh interpreters) or xla (torch_xla's xmp.spawn)."""
from __future__ import annotations

from .base import Backend

START_METHODS = ("fork", "spawn", "xla")


def get_backend(start_method: str) -> Backend:
    """The backend for a ``start_method`` (validated by ``options``)."""
    if start_method == "fork":
        from .fork import ForkBackend
        return ForkBackend()
    if start_method == "spawn":
        from .spawn import SpawnBackend
        return SpawnBackend()
    if start_method == "ray":  # cluster=RayCluster(...): ranks are Ray actors (backends.ray_launch)
        from .ray_gang import RayBackend
        return RayBackend()
    if start_method == "xla":
        from .xla import XlaBackend
        return XlaBackend()
    raise NotImplementedError(f"start_method={start_method!r} is not available; use 'fork', 'spawn' or 'xla'")
