"""Ranks' pace samples from a training loop written as plain numbers, for the slow-rank verdict's
tests (test_slow_rank.py): the samples each rank's real counters (``rank.reports.pace.Pace``) send
when its own work before each collective takes the seconds given, on a simulated clock.

The loop: every rank of one group calls one collective per step; before step k rank r works
``works[r][k]`` seconds (its forward and backward pass, its data loader, an evaluation only it
runs). A collective returns once every rank entered it (plus ``transfer``), on every rank at
once, and the next step's work starts then. The progress thread looks every ``tick`` seconds
and sends a sample when ``Pace.sample`` has one (about once a second), and the rank's last
flush sends its final totals: what the notebook receives, with no process and no timing luck.
"""
from __future__ import annotations

from typing import Any, Sequence

from notebook_launch.rank.reports import pace as rank_pace

TICK = 0.1        # the progress thread's period (rank.reports.progress.SEND_INTERVAL)
TRANSFER = 0.0005


class SimulatedClock:
    """The rank side's clock, moved by the simulation."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def samples_of_a_loop(works: Sequence[Sequence[float]], ops: Sequence[str] | None = None,
                      transfer: float = TRANSFER, tick: float = TICK) -> dict[int, list[dict[str, Any]]]:
    """Each rank's pace samples, in the order it sends them (rank -> payloads); ``ops[k]`` is the
    collective of step k (all_reduce by default)."""
    steps = len(works[0])
    if any(len(rank_works) != steps for rank_works in works):
        raise ValueError("every rank needs the same number of steps")
    entered: list[list[float]] = [[] for _ in works]
    returned: list[float] = []
    now = 0.0
    for step in range(steps):
        for rank, rank_works in enumerate(works):
            entered[rank].append(now + rank_works[step])
        now = max(entered[rank][step] for rank in range(len(works))) + transfer
        returned.append(now)
    names = list(ops) if ops is not None else ["all_reduce"] * steps
    return {rank: _samples(entered[rank], returned, names, tick) for rank in range(len(works))}


def _samples(entered: list[float], returned: list[float], names: list[str], tick: float) -> list[dict[str, Any]]:
    clock = SimulatedClock()
    saved = rank_pace._clock
    rank_pace._clock = clock
    try:
        pace = rank_pace.Pace()
        events = sorted([(at, 1, step) for step, at in enumerate(entered)]
                        + [(at, 0, step) for step, at in enumerate(returned)])
        sent: list[dict[str, Any]] = []
        next_tick = tick
        tokens: dict[int, float] = {}
        for at, kind, step in events:
            while next_tick < at:
                clock.now = next_tick
                _keep(sent, pace.sample())
                next_tick += tick
            clock.now = at
            if kind == 1:
                tokens[step] = pace.enter(names[step])
            else:
                pace.leave(names[step], tokens.pop(step))
        _keep(sent, pace.sample(force=True))
        return sent
    finally:
        rank_pace._clock = saved


def _keep(sent: list[dict[str, Any]], sample: dict[str, Any] | None) -> None:
    if sample is not None:
        sent.append(sample)
