"""The channels between the notebook and its ranks, and the handle on a rank's process.

These types are what every side shares: the launchers open and hand them to the ranks,
the rank side writes to them, the supervisor reads them. They depend on nothing else of
notebook_launch (only the standard library), so importing them never pulls a launcher,
the supervisor or the rank side along: imports go one way, from the API down to here.

``pipes``: a local rank's four pipes and its result file. ``process``: how a rank
process is watched and ended. ``sockets``: the same pipes over TCP for ranks on
other machines (Ray). The formats both sides read, so that neither reads the other's
module for them: ``where_request`` (asking a rank where it is), ``commands`` and
``interrupt_slot`` (persistent ranks' calls and interrupts), ``remote_commands`` (the same
for a persistent rank on another machine).

Owns: the rank's pipes, sockets and memfds, the ``RankProcess`` handle and the formats both sides read. May
import: the standard library only (the bottom of the graph).
"""
from __future__ import annotations

from .pipes import RankPipes, create_memfd, read_ready
from .process import (LOST, STUCK, WAIT_LIMIT, EndUsage, PidfdRank, RankProcess, WaitStatus, ended_status, reap,
                      stuck_note)

__all__ = ["EndUsage", "LOST", "PidfdRank", "RankPipes", "RankProcess", "STUCK", "WAIT_LIMIT", "WaitStatus",
           "create_memfd", "ended_status", "read_ready", "reap", "stuck_note"]
