"""Persistent ranks: keep the ranks (and what they built) alive across calls and cells.

``pool`` (notebook side: ``start_ranks``, ``Ranks``) and ``call`` (one supervised call);
``serve`` and ``namespace`` run inside the ranks; ``commands`` is the notebook -> rank
pipe; ``magic`` is ``%ranks`` / ``%%ranks``.
"""
from __future__ import annotations

from .pool import Ranks, start_ranks

__all__ = ["Ranks", "start_ranks"]
