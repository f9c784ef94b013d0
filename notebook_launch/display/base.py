"""The display interface the supervisor drives, from the parent's main thread only."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..record.line_prefix import parse_line_prefix

if TYPE_CHECKING:
    from ..record.state import RunState


class Display:
    """Does nothing visible: ``ui="none"``. Subclasses override what they show.

    The supervisor calls ``start`` once, ``line`` for every whole output line,
    ``refresh`` often (a display throttles itself), and ``close`` once with the
    final state, also after a failure or an interrupt.
    """
    name = "none"  # what ui= selects it, shown in the launch line

    def __init__(self, line_prefix: str | None = None) -> None:
        self.line_prefix = parse_line_prefix(line_prefix)   # log_line_prefix_template, checked by options

    def tag(self, state: RunState, local_rank: int) -> str:
        """What goes before a rank's line, separator included ("[rank 0] ", "default-0: ")."""
        rank_state = state.ranks[local_rank]
        node_rank = state.node_rank if rank_state.node_rank is None else rank_state.node_rank   # Ray: its own
        return self.line_prefix.render(rank=rank_state.rank, local_rank=local_rank, node_rank=node_rank)

    def start(self, state: RunState) -> None:
        pass

    def line(self, state: RunState, local_rank: int, stream: str, text: str) -> None:
        pass

    def refresh(self, state: RunState) -> None:
        pass

    def prompting(self, state: RunState, showing: bool) -> None:
        """A rank's prompt waits in the terminal (``showing``) or was answered: a display that
        redraws the terminal stops doing so meanwhile."""

    def before_output(self, state: RunState) -> None:
        """A rank's ``display()`` output is about to reach the cell: a panel not drawn yet
        (``deferred``) is drawn first, so it stays above the run's outputs."""

    def close(self, state: RunState) -> None:
        pass
