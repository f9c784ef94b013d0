"""The notebook's half of the display relay: re-publish a rank's display() in the cell, throttled.

The rank's half is ``rank/integrations/display_relay.py`` (same name, the package says which side).
Ranks send their display calls as events (``rank.integrations.display_relay``); the
supervisor hands them here, on the notebook's main thread, and ``pump``
publishes them with the kernel's own display functions, so they reach the
cell running the launch.

Each relayed rank owns a list of output slots in the cell. Every slot is
published with a display id of ours, so the rank's later updates (by its own
display ids, mapped to ours) and its ``clear_output`` act on that rank's slots
only: a rank's ``clear_output`` empties its own outputs and never the cell,
so the panel and the other ranks' outputs stay. A slot emptied by a clear is
reused by the rank's next display, so a ``clear_output(wait=True); display(x)``
loop keeps one output instead of growing the cell.

Throttled like the panel (the IOPub rate limit drops messages past about
1000 per second): a new output appears at once, within a budget of
NEW_OUTPUTS_BURST refilled at NEW_OUTPUTS_PER_SECOND (beyond it, new outputs
are dropped and counted); changes to outputs already shown (updates, clears,
reuse after a clear) are published at most MAX_PUBLISHES_PER_SECOND times a
second, only the latest content of each, and the final content always.
"""
from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..notebook.notebook_streams import OUT, flushable_streams

log = logging.getLogger("notebook_launch")

MAX_PUBLISHES_PER_SECOND = 5
NEW_OUTPUTS_PER_SECOND = 10
NEW_OUTPUTS_BURST = 50
EMPTY = {"text/plain": ""}

Publish = Callable[[dict[str, Any], dict[str, Any], str, bool], None]


@dataclass(eq=False)
class _Slot:
    display_id: str
    data: dict[str, Any]
    metadata: dict[str, Any]
    changed: bool = False   # since it was last published


@dataclass(eq=False)
class _RankOutputs:
    slots: list[_Slot] = field(default_factory=list)
    free: deque[_Slot] = field(default_factory=deque)
    by_rank_id: dict[str, list[_Slot]] = field(default_factory=dict)
    clear_pending: bool = False
    dropped: int = 0


class RankDisplays:
    """Re-publishes the display calls of the ranks in ``ranks`` (global ranks) in the cell."""

    def __init__(self, ranks: frozenset[int] | None, run_id: str, publish: Publish | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ranks = ranks    # None: every rank
        self._publish = publish or publish_in_kernel
        self._clock = clock
        self._ids = (f"nl-{run_id}-{n}" for n in itertools.count())
        self._outputs: dict[int, _RankOutputs] = {}
        self._tokens = float(NEW_OUTPUTS_BURST)
        self._refilled_at = clock()
        self._published_at = 0.0

    def on_event(self, rank: int, payload: dict[str, Any]) -> None:
        """Fold one display event of global rank ``rank``."""
        if self.ranks is not None and rank not in self.ranks:
            return
        outputs = self._outputs.setdefault(rank, _RankOutputs())
        if payload.get("op") == "clear":
            if payload.get("wait"):
                outputs.clear_pending = True
            else:
                self._clear(outputs)
            return
        data, metadata = payload.get("data") or EMPTY, payload.get("metadata") or {}
        rank_id = payload.get("display_id")
        if payload.get("update"):
            for slot in outputs.by_rank_id.get(rank_id, []) if rank_id else []:
                slot.data, slot.metadata, slot.changed = data, metadata, True
            return
        if outputs.clear_pending:
            outputs.clear_pending = False
            self._clear(outputs)
        if outputs.free:   # reuse an output the rank cleared: an update, throttled
            slot = outputs.free.popleft()
            slot.data, slot.metadata, slot.changed = data, metadata, True
        elif self._take_token():   # a new output appears right away
            slot = _Slot(next(self._ids), data, metadata)
            outputs.slots.append(slot)
            self._publish(data, metadata, slot.display_id, False)
        else:
            outputs.dropped += 1
            return
        if rank_id:
            outputs.by_rank_id.setdefault(rank_id, []).append(slot)

    def pump(self, final: bool = False) -> None:
        """Publish what changed, at most MAX_PUBLISHES_PER_SECOND times a second (always when ``final``)."""
        now = self._clock()
        if not final and now - self._published_at < 1.0 / MAX_PUBLISHES_PER_SECOND:
            return
        self._published_at = now
        for rank in sorted(self._outputs):
            for slot in self._outputs[rank].slots:
                if slot.changed:
                    slot.changed = False
                    self._publish(slot.data, slot.metadata, slot.display_id, True)

    def close(self) -> None:
        """Publish the final content, and say what could not be shown."""
        self.pump(final=True)
        for rank, outputs in sorted(self._outputs.items()):
            if outputs.dropped:
                print(f"notebook_launch: {outputs.dropped} display() outputs of rank {rank} were not shown "
                      f"(more than {NEW_OUTPUTS_PER_SECOND} new outputs a second)", file=OUT, flush=True)

    def _clear(self, outputs: _RankOutputs) -> None:
        """Empty every output of the rank; the next displays refill them from the top."""
        outputs.by_rank_id.clear()
        for slot in outputs.slots:
            if slot.data is not EMPTY:
                slot.data, slot.metadata, slot.changed = EMPTY, {}, True
        outputs.free = deque(outputs.slots)

    def _take_token(self) -> bool:
        now = self._clock()
        self._tokens = min(float(NEW_OUTPUTS_BURST),
                           self._tokens + (now - self._refilled_at) * NEW_OUTPUTS_PER_SECOND)
        self._refilled_at = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True


def publish_in_kernel(data: dict[str, Any], metadata: dict[str, Any], display_id: str, update: bool) -> None:
    """The kernel's own display path, from the thread running the cell."""
    from IPython.display import publish_display_data
    with flushable_streams():
        publish_display_data(data, metadata, transient={"display_id": display_id}, update=update)

