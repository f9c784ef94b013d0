"""This machine's engine: ranks forked (``fork``, ``fork_thread``) or spawned as fresh interpreters
(``spawn``), from the notebook or from the warm start process (``start_process``, whose server side
is ``start_server``; ``warm_imports`` says what it and a forking notebook import ahead), and
persistent ranks of this machine (``persistent.LocalTransport``). Each launcher implements
``engines.base.Launcher``; elastic's agent starts each attempt through ``get_backend``'s.

Owns: starting ranks on this machine. May import: ``engines.base``, the plan and the options, channels, wire,
the rank side, ``persistent``'s pool and transport interface, supervise's outcome, record, process; never
another engine.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..base import Launcher

if TYPE_CHECKING:
    from ...wire.plan import PlanStartMethod


def get_backend(start_method: PlanStartMethod) -> Launcher:
    """The launcher of this machine for ``start_method`` (fork or spawn, validated by ``options``;
    torch_xla's is ``engines.launcher_for``'s)."""
    if start_method == "fork":
        from .fork import ForkBackend
        return ForkBackend()
    if start_method == "spawn":
        from .spawn import SpawnBackend
        return SpawnBackend()
    raise NotImplementedError(f"start_method={start_method!r} is not this engine's; use 'fork' or 'spawn'")
