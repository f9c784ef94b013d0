"""Persistent ranks: keep the ranks (and what they built) alive across calls and cells.

``pool`` (notebook side: ``Ranks``), ``call`` (one supervised call) and ``quick`` (a call over at
once, finished without a supervisor); ``life`` (the ranks around
the calls) and ``transport`` (how the pool reaches its ranks: ``RankTransport``, which each engine
implements in its own folder: ``engines.local.persistent``, ``engines.remote.persistent`` with
Ray's and SLURM's); ``idle`` reads the ranks between calls; ``command_frames`` is a call's frame;
``whereabouts`` says where the ranks are (``Ranks.stacks()``), in a call or between calls.
``start_ranks`` (``notebook_launch.ranks``) and ``%ranks`` (``notebook_launch.magics.ranks``) sit
above this package and the engines: the pool imports no engine.

Owns: ranks kept across calls: the pool (``Ranks``), one supervised call, a call over at once finished without
a supervisor (``quick``), the transport interface each engine implements. May import: planning, scaffold,
supervise, diagnose, record, display, wire, channels, the rank side's formats, errors; never an engine.
"""
from __future__ import annotations

from .pool import Ranks

__all__ = ["Ranks"]
