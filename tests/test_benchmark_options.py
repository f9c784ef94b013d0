"""benchmarks/run.py's options, read without running a benchmark: ``--ranks`` keeps only the rank
counts asked for in every item that sweeps them (a quicker rerun of one goal row), and bad values are
refused naming the option before anything is measured."""
from __future__ import annotations

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import run  # noqa: E402


def config_for(*argv: str) -> dict:
    args = run.parse_args(list(argv))
    return run.only_ranks(run.restrict(run.make_config(args.quick, args.repeats), args.only), args.ranks)


def test_ranks_keeps_only_those_counts_in_every_sweep():
    config = config_for("--only", "1,6,13", "--ranks", "2")
    assert config["spawn_ranks"] == [2] and config["trivial_ranks"] == [2] and config["fresh_ranks"] == [2]
    assert config["memory_ranks"] == 2 and config["soak_ranks"] == 8   # counts, not sweeps: as they were


def test_without_ranks_each_item_keeps_its_own_sweep():
    assert config_for("--only", "13")["spawn_ranks"] == [2, 4, 8]
    assert config_for("--only", "6")["trivial_ranks"] == [1, 2, 4, 8]


@pytest.mark.parametrize("value", ["two", "0", "2,-4"])
def test_a_bad_ranks_value_is_refused_naming_the_option(value, capsys):
    with pytest.raises(SystemExit) as ended:
        run.parse_args(["--ranks", value])
    assert ended.value.code == 2 and "--ranks" in capsys.readouterr().err
