"""The launchers: every way of starting ranks behind one interface (``base.Launcher``:
``start(plan, job, channels) -> processes``): ``fork``, ``spawn`` (fresh interpreters), ``xla``
(torch_xla's xmp.spawn); a cluster engine's launcher lives in its own package, beside this one
(``ray.launch.RayLauncher``: Ray actors, made by ``ray.run`` with the connected cluster).
Elastic's agent starts each attempt through the fork or spawn launcher."""
from __future__ import annotations

from typing import TYPE_CHECKING

from .base import Launcher

if TYPE_CHECKING:
    from ..plan import PlanStartMethod


def get_backend(start_method: PlanStartMethod) -> Launcher:
    """The launcher for a ``start_method`` (validated by ``options``). Ray's needs the
    connected cluster: ``ray.run`` makes it (``ray.launch.RayLauncher``)."""
    if start_method == "fork":
        from .fork import ForkBackend
        return ForkBackend()
    if start_method == "spawn":
        from .spawn import SpawnBackend
        return SpawnBackend()
    if start_method == "xla":
        from .xla import XlaBackend
        return XlaBackend()
    raise NotImplementedError(f"start_method={start_method!r} is not available; use 'fork', 'spawn' or 'xla'")
