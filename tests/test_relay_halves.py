"""Every exchange between a rank and the notebook that has a module on each side (a relay, a
record one side writes and the other reads, a request and its answer) names its two halves
alike: the rank's half is ``rank/<name>.py``, the notebook's ``<package>/<name>.py``, the package
saying which side (issue 31 item 7)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "notebook_launch"

# (the rank's half, the notebook's half): what crosses between them
HALVES = [
    ("rank/stdin_relay.py", "supervise/stdin_relay.py"),    # a rank's input()/getpass()/pdb prompt, its answer
    ("rank/display_relay.py", "display/display_relay.py"),  # a rank's display() calls, re-published in the cell
    ("rank/where_thread.py", "diagnose/where_thread.py"),   # where a rank is: the request, its stacks back
    ("rank/xla_replicas.py", "diagnose/xla_replicas.py"),   # each XLA replica's collective record
    ("rank/remote_where.py", "diagnose/remote_where.py"),   # where a Ray or SLURM rank is, over its connections
]


def same_name(rank_half: str, notebook_half: str) -> bool:
    return Path(rank_half).stem == Path(notebook_half).stem


@pytest.mark.parametrize("rank_half, notebook_half", HALVES, ids=[Path(r).stem for r, _ in HALVES])
def test_the_two_halves_of_an_exchange_share_a_name(rank_half, notebook_half):
    assert rank_half.startswith("rank/") and not notebook_half.startswith("rank/")
    assert (PACKAGE / rank_half).is_file() and (PACKAGE / notebook_half).is_file()
    assert same_name(rank_half, notebook_half), (rank_half, notebook_half)
    docstring = ast.get_docstring(ast.parse((PACKAGE / notebook_half).read_text())) or ""
    rank_module = Path(rank_half).with_suffix("").as_posix()
    assert rank_module in docstring or rank_module.replace("/", ".") in docstring, \
        f"{notebook_half}'s docstring does not name its rank half {rank_half}"
