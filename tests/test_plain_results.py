"""A rank's plain result (a number, None, a short str or bytes, of exactly those types) is
pickled by pickle itself (``rank.runner.serialize_result``, issue 45): the very bytes the result
picklers write, loaded alike in the notebook; anything else, subclasses included, takes the
result picklers' way. No process: both ways side by side."""
import enum
import math

import pytest

from notebook_launch.rank import result_pickle
from notebook_launch.rank.runner import SHORT, serialize_result
from notebook_launch.wire import shared_tensors

PLAIN = [0, -5, 2 ** 100, 1.5, -0.0, math.inf, True, False, None, 1 + 2j, "", "x" * 10, "été ✓", b"",
         b"\x00\xff", "s" * SHORT, b"b" * SHORT]


def by_the_result_picklers(value):
    return shared_tensors.dumps(value, None, base=result_pickle.pickler_base(False))


@pytest.mark.parametrize("value", PLAIN, ids=lambda v: f"{type(v).__name__}:{str(v)[:12]}")
def test_a_plain_value_is_the_same_pickle_either_way(value):
    data = serialize_result(value)
    assert data == by_the_result_picklers(value)
    assert shared_tensors.loads(data, None) == value


class Colour(enum.IntEnum):
    RED = 1


class Name(str):
    pass


@pytest.mark.parametrize("value", [Colour.RED, Name("n"), "s" * (SHORT + 1), (1, 2), [1], {"a": 1}])
def test_anything_else_takes_the_result_picklers_way(value, monkeypatch):
    """Subclasses of the plain types, long strings and containers are pickled by the result
    picklers (they are the ones that see tensors inside, or a big stream)."""
    seen = []
    real = shared_tensors.dumps

    def spied(*args, **kwargs):
        seen.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(shared_tensors, "dumps", spied)
    loaded = shared_tensors.loads(serialize_result(value), None)
    assert seen == [value] and loaded == value and type(loaded) is type(value)
