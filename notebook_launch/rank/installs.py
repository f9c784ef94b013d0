"""What the rank's core runs but does not import: each piece a rank installs before the user's
function, or calls at a fixed moment of its life, named by its module; and what a process that
forks ranks imports ahead of them (``WARM``).

Why names and not imports: the pieces live in the rank's sub-packages (the integrations with
other libraries: tqdm, rich, Transformers, Lightning, IPython's display, stdin; the rank's
reports: where it is, its bars and pace; its process group's care), and they use the core's
tools (``after_import``, ``inherited_streams``, ``bootstrap``). The core importing them would
close a cycle; the core reading a table of their names, resolved with importlib, does not. A new
integration is one line in ``RANK_HOOKS`` (CONTRIBUTING.md).
"""
from __future__ import annotations

import importlib
import sys
from typing import Any, Callable, NamedTuple


class Hook(NamedTuple):
    """A module whose ``install(spec)`` every rank calls before the user's function runs."""
    module: str
    # when not empty: the hook runs under ``best_effort`` with this message (a library we cannot
    # patch still works, only unbridged), and its module is imported only when the hook runs
    best_effort: str = ""


# In this order, in every rank (``runner.rank_hooks`` is made from it).
RANK_HOOKS: tuple[Hook, ...] = (
    # tqdm, rich and Transformers bars in a rank report to the panel
    Hook("notebook_launch.rank.integrations.progress_bridge", "progress bridge not installed"),
    Hook("notebook_launch.rank.stdin_relay"),   # input(), getpass(), pdb ask the notebook
    # display() in a rank forked from a Jupyter kernel reaches the cell (else it goes nowhere)
    Hook("notebook_launch.rank.integrations.display_relay", "display relay not installed"),
    # the notebook can ask where this rank is, even blocked in C (issue 20)
    Hook("notebook_launch.rank.reports.whereabouts"),
    # Lightning's ddp_notebook etc. join the launched ranks (issue 25)
    Hook("notebook_launch.rank.integrations.lightning_strategy"),
    # no rank leaves a gloo group its peers are still joining
    Hook("notebook_launch.rank.group.peers_joined"),
    # its row says "joining the process group" while init_process_group runs
    Hook("notebook_launch.rank.group.joining"),
)

# The process group's care the runner calls at fixed moments (see ``process_groups``, ``peers_joined``).
PROCESS_GROUPS = "notebook_launch.rank.group.process_groups"
PEERS_JOINED = "notebook_launch.rank.group.peers_joined"
PROGRESS = "notebook_launch.rank.reports.progress"   # its bars' last counts are flushed before RESULT/ERROR

# What a process that forks ranks imports once so its ranks share it (ours: ms per rank): the
# notebook before a fork (``engines.local.warm_imports``), the warm start process and SLURM's node
# agent (``preload``).
# Every rank hook's module among them: one a rank imported itself cost it its import (the display
# relay's, about 2.5 ms of every rank's CPU, when it was left to the ranks), and importing one installs
# nothing (each hook patches only when the rank calls its ``install``).
WARM: tuple[str, ...] = (
    PROCESS_GROUPS, PROGRESS,
    *(hook.module for hook in RANK_HOOKS),
    "notebook_launch.rank.integrations.rich_bridge",
    "notebook_launch.rank.integrations.tqdm_bridge",
    "notebook_launch.rank.integrations.transformers_bridge",
)


def named(module: str, function: str) -> Callable[..., Any]:
    """``module.function``, looked up now: a test that replaces the function on its module is
    heard. An imported module is taken from ``sys.modules`` (``import_module`` costs a lock and
    a few calls, twice in every call on persistent ranks, issue 45)."""
    found = sys.modules.get(module)
    return getattr(found if found is not None else importlib.import_module(module), function)


def warm() -> None:
    """Import ``WARM``."""
    for module in WARM:
        importlib.import_module(module)
