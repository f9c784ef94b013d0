"""Persistent ranks: keep the ranks (and what they built) alive across calls and cells.

``start`` (``start_ranks``) and ``pool`` (notebook side: ``Ranks``) and ``call`` (one supervised call);
``life`` (the ranks around the calls) and ``transport`` (how the pool reaches its ranks: ``local``,
``ray_ranks``);
``serve`` and ``namespace`` run inside the ranks; ``commands`` is the notebook -> rank
pipe; ``magic`` is ``%ranks`` / ``%%ranks``.
"""
from __future__ import annotations

from .pool import Ranks
from .start import start_ranks

__all__ = ["Ranks", "start_ranks"]
