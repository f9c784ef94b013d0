"""What ``Ranks.run_cell`` (``%%ranks``) checks and says before a cell goes to the ranks: its
arguments, the ranks that run it, and the values that cannot be sent."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..errors import LaunchArgumentError
from ..notebook.notebook_streams import OUT
from ..planning.options import validate_text


def checked_cell(source: str, filename: str, values: dict[str, Any] | None) -> dict[str, Any]:
    """``run_cell``'s arguments checked (an error that says what each must be); its values, a dict."""
    if not isinstance(source, str):
        raise LaunchArgumentError(f"run_cell(source=...) must be the cell's code as a str; got "
                                  f"{type(source).__name__}")
    validate_text("run_cell(filename=...)", filename, "the name tracebacks show for the cell, a str")
    if values is not None and (not isinstance(values, dict)
                               or not all(isinstance(n, str) and n.isidentifier() for n in values)):
        raise LaunchArgumentError(f"run_cell(values=...) must be a dict of variable names to values, or "
                                  f"None; got {values!r:.120}")
    return dict(values or {})


def rank_subset(ranks: Iterable[int] | None, world: int) -> frozenset[int] | None:
    """``ranks`` (``run_cell``'s, ``%%ranks --ranks``) checked against the world size (an error
    naming the bad ones)."""
    if ranks is None:
        return None
    if isinstance(ranks, int) and not isinstance(ranks, bool):
        ranks = [ranks]
    try:
        chosen: list[object] = list(ranks)
    except TypeError:
        chosen = [ranks]   # not iterable: named as the bad value below
    bad = [r for r in chosen if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < world]
    if bad or not chosen:
        raise LaunchArgumentError(
            f"ranks={ranks!r}: give one or more global ranks between 0 and {world - 1} "
            f"(these ranks are {world}), e.g. ranks=[0] or %%ranks --ranks 0,2"
            + (f"; not ranks here: {', '.join(map(repr, bad))}" if bad else ""))
    return frozenset(r for r in chosen if isinstance(r, int))


def say_who_runs(subset: frozenset[int], idle: list[int]) -> None:
    """A cell for some ranks only: which run it, and that the others wait with their state."""
    wait = "run nothing and wait" if len(idle) > 1 else "runs nothing and waits"
    print(f"notebook_launch: %%ranks: this cell runs on rank{'s' * (len(subset) > 1)} "
          f"{', '.join(map(str, sorted(subset)))} only; rank{'s' * (len(idle) > 1)} "
          f"{', '.join(map(str, idle))} {wait}, "
          f"with {'their' if len(idle) > 1 else 'its'} state (the cell must not call a collective "
          f"that needs {'them' if len(idle) > 1 else 'it'})", file=OUT, flush=True)


def say_unsent(unsent: dict[str, str]) -> None:
    """The cell's values that do not pickle: the ranks use their own."""
    print("notebook_launch: %%ranks: not sent to the ranks: "
          + "; ".join(f"{name} ({why})" for name, why in unsent.items())
          + ". The ranks use their own value of these names; where they have none, the cell stops "
          "with a NameError before it runs. Create such values in the ranks (in a %%ranks cell).",
          file=OUT, flush=True)


__all__ = ["checked_cell", "rank_subset", "say_unsent", "say_who_runs"]
