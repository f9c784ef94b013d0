"""Every exchange between a rank and the notebook that has a module on each side (a relay, a
record one side writes and the other reads, a request and its answer) names its two halves
alike: the rank's half is ``rank/<name>.py``, the notebook's ``<package>/<name>.py``, the package
saying which side (issue 31 item 7). An exchange of one engine keeps both halves in its engine's
folder (issue 46), the notebook's half named after the rank's and naming it."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "notebook_launch"

# (the rank's half, the notebook's half): what crosses between them
HALVES = [
    ("rank/stdin_relay.py", "supervise/stdin_relay.py"),    # a rank's input()/getpass()/pdb prompt, its answer
    # a rank's display() calls, re-published in the cell
    ("rank/integrations/display_relay.py", "display/display_relay.py"),
    ("rank/reports/where_thread.py", "diagnose/where_thread.py"),   # where a rank is: the request, its stacks back
    ("rank/reports/remote_where.py", "diagnose/remote_where.py"),   # where a Ray or SLURM rank is, over its connections
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


# (the rank's half, the notebook's half) of an exchange only one engine has: both in its folder
ENGINE_HALVES = [
    ("engines/xla/replicas.py", "engines/xla/replica_whereabouts.py"),   # each XLA replica's collective record
]


@pytest.mark.parametrize("rank_half, notebook_half", ENGINE_HALVES, ids=[Path(r).stem for r, _ in ENGINE_HALVES])
def test_an_engines_own_exchange_keeps_both_halves_in_its_folder(rank_half, notebook_half):
    assert Path(rank_half).parent == Path(notebook_half).parent and rank_half.startswith("engines/")
    assert (PACKAGE / rank_half).is_file() and (PACKAGE / notebook_half).is_file()
    assert Path(notebook_half).stem.startswith(Path(rank_half).stem.rstrip("s")), (rank_half, notebook_half)
    docstring = ast.get_docstring(ast.parse((PACKAGE / notebook_half).read_text())) or ""
    rank_module = Path(rank_half).with_suffix("").as_posix().replace("/", ".")
    assert rank_module in docstring, f"{notebook_half}'s docstring does not name its rank half {rank_half}"
