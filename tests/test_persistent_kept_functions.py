"""A notebook function's pickle kept across calls (issue 45), with real forked ranks: whatever
changes in the notebook between two calls of the same function, the second call sees it, as when
every call pickled the function afresh; and a function that keeps nothing changeable is pickled
once and unpickled once. The fingerprint itself, without processes: test_function_fingerprint.py."""
import os
import textwrap

import pytest

from notebook_launch import start_ranks
from notebook_launch.planning.net import free_port
from notebook_launch.wire import function_pickles

pytestmark = pytest.mark.timeout(120)


def kept_in_rank() -> int:
    """(In a rank; importable, so sent by reference) how many functions this rank keeps unpickled."""
    return len(function_pickles.loaded._loaded)


def forget_kept_in_rank() -> None:
    function_pickles.loaded.clear()


def module_in_rank() -> bool:
    """(In a rank) whether the notebook's ``os`` arrived as this rank's own module."""
    import sys
    return sys.modules["os"] is __import__("os")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    with start_ranks(2, ui="none", log_dir=str(tmp_path_factory.mktemp("logs")), use_port=free_port()) as pool:
        yield pool


def cell(notebook: dict, source: str) -> dict:
    """Run a notebook cell: ``source`` in ``notebook``, the globals of the notebook's ``__main__``."""
    notebook.setdefault("__name__", "__main__")
    exec(textwrap.dedent(source), notebook)
    return notebook


def twice(ranks, notebook: dict, name: str, change) -> tuple[list, list]:
    """``notebook[name]`` run, ``change`` made in the notebook, run again (looked up anew)."""
    first = ranks.run(notebook[name])
    change(notebook)
    return first, ranks.run(notebook[name])


def test_a_global_int_rebound_between_calls_is_seen(ranks):
    notebook = cell({}, "step_size = 1\ndef read_step():\n    return step_size\n")
    ranks.run(notebook["read_step"])   # the pickle is kept from here on
    assert twice(ranks, notebook, "read_step", lambda nb: nb.update(step_size=2)) == ([1, 1], [2, 2])


def test_a_global_list_appended_to_between_calls_is_seen(ranks):
    notebook = cell({}, "history = [1]\ndef read_history():\n    return list(history)\n")
    ranks.run(notebook["read_history"])
    assert twice(ranks, notebook, "read_history", lambda nb: nb["history"].append(2)) == \
        ([[1], [1]], [[1, 2], [1, 2]])


def test_a_function_redefined_in_a_cell_is_seen(ranks):
    notebook = cell({}, "def answer():\n    return 'first'\n")
    ranks.run(notebook["answer"])
    second = lambda nb: cell(nb, "def answer():\n    return 'second'\n")   # noqa: E731
    assert twice(ranks, notebook, "answer", second) == (["first"] * 2, ["second"] * 2)


def test_a_closure_cell_changed_is_seen(ranks):
    notebook = cell({}, """
        def make():
            level = 1
            def read_level():
                return level
            def set_level(value):
                nonlocal level
                level = value
            return read_level, set_level
        read_level, set_level = make()
    """)
    ranks.run(notebook["read_level"])
    assert twice(ranks, notebook, "read_level", lambda nb: nb["set_level"](5)) == ([1, 1], [5, 5])


def test_changed_defaults_are_seen(ranks):
    notebook = cell({}, "def scaled(x=2, *, by=10):\n    return x * by\n")
    ranks.run(notebook["scaled"])

    def change(nb):
        nb["scaled"].__defaults__ = (3,)
        nb["scaled"].__kwdefaults__["by"] = 100
    assert twice(ranks, notebook, "scaled", change) == ([20, 20], [300, 300])


def test_a_function_that_assigns_a_global_in_the_rank_behaves_as_before(ranks):
    """What a rank assigns is the rank's from then on (rank.namespace): the count goes on in the
    rank, whatever the notebook's value, whether the function's pickle was kept or not."""
    notebook = cell({}, "bumps = 0\ndef bump():\n    global bumps\n    bumps += 1\n    return bumps\n")
    assert ranks.run(notebook["bump"]) == [1, 1]
    assert ranks.run(notebook["bump"]) == [2, 2]
    notebook["bumps"] = 10
    assert ranks.run(notebook["bump"]) == [3, 3]
    assert notebook["bumps"] == 10


def test_a_mutable_default_changed_in_the_rank_starts_afresh_each_call_as_before(ranks):
    notebook = cell({}, "def gather(seen=[]):\n    seen.append(1)\n    return len(seen)\n")
    assert [ranks.run(notebook["gather"]) for _ in range(3)] == [[1, 1]] * 3


def test_a_redefined_helper_function_sent_by_value_is_seen(ranks):
    notebook = cell({}, "def helper():\n    return 'old'\ndef outer():\n    return helper()\n")
    ranks.run(notebook["outer"])
    new = lambda nb: cell(nb, "def helper():\n    return 'new'\n")   # noqa: E731
    assert twice(ranks, notebook, "outer", new) == (["old"] * 2, ["new"] * 2)


def test_a_module_global_travels_by_reference_and_the_pickle_is_kept(ranks):
    notebook = cell({}, "import os\ndef pid_of_rank():\n    return os.getpid(), os.__name__\n")
    ranks.run(forget_kept_in_rank)
    pids = [pid for pid, _ in ranks.run(notebook["pid_of_rank"])]
    assert pids == ranks.pids and pids[0] != os.getpid()
    assert ranks.run(notebook["pid_of_rank"]) == [(pid, "os") for pid in pids]
    assert ranks.run(module_in_rank) == [True, True]
    kept = function_pickles.kept._kept[id(notebook["pid_of_rank"])]
    assert kept[0] is notebook["pid_of_rank"] and any(value is os for value in kept[1].by_reference)
    assert ranks.run(kept_in_rank) == [1, 1]   # unpickled once, kept for the second call


def test_in_a_real_kernel_each_call_sees_the_notebook_of_its_time(tmp_path):
    """The same in a Jupyter kernel, whose cells define functions in the real ``__main__``."""
    from helpers.nbutil import make_notebook, run_notebook
    nb = make_notebook(
        "from notebook_launch import start_ranks\nfrom notebook_launch.planning.net import free_port\n"
        "ranks = start_ranks(2, ui='none', use_port=free_port())",
        "limit = 1\nseen = [1]\ndef helper():\n    return 'old'\n"
        "def report():\n    return limit, helper()\ndef history():\n    return list(seen)",
        "[(ranks.run(report), ranks.run(history)) for _ in range(3)][-1]",
        "limit = 2\nseen.append(2)\n[(ranks.run(report), ranks.run(history)) for _ in range(3)][-1]",
        "def helper():\n    return 'new'\nranks.run(report)",
        "def report():\n    return 'redefined'\nranks.run(report)",
        "ranks.close()",
    )
    run_notebook(nb, cwd=str(tmp_path))
    results = [[o for o in cell.outputs if o.output_type == "execute_result"] for cell in nb.cells]
    shown = [r[-1]["data"]["text/plain"] if r else None for r in results]
    assert shown[2:6] == ["([(1, 'old'), (1, 'old')], [[1], [1]])", "([(2, 'old'), (2, 'old')], [[1, 2], [1, 2]])",
                          "[(2, 'new'), (2, 'new')]", "['redefined', 'redefined']"]
