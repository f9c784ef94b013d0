"""A notebook function's pickle kept across calls (issue 45), without processes: when a
Fingerprint holds and when it must not, the notebook's kept bytes and a rank's kept function,
and a CALL frame encoded with kept bytes decoding to the same call. The same with real ranks:
test_persistent_kept_functions.py."""
import math
import sys
import textwrap
import types

import pytest

from notebook_launch.channels import commands
from notebook_launch.persistent import command_frames
from notebook_launch.rank.runner import Job
from notebook_launch.rank.serve import Call
from notebook_launch.wire import shared_tensors
from notebook_launch.wire.function_fingerprint import fingerprint
from notebook_launch.wire.function_pickles import KeptPickles, LoadedFunctions


def cell(source: str, filename: str = "<cell 3>", **values) -> dict:
    """A notebook's globals after running ``source`` in them (its functions are ``__main__``'s)."""
    notebook = {"__name__": "__main__", **values}
    exec(compile(textwrap.dedent(source), filename, "exec"), notebook)
    return notebook


def importable() -> int:
    return 1


class Importable:
    pass


@pytest.mark.parametrize("value", [3, 2.5, 1j, True, None, "text", b"bytes", (1, ("a", None)),
                                   frozenset({1, 2}), math, math.sqrt, len, importable, Importable, int])
def test_a_function_naming_only_immutable_or_importable_values_has_a_fingerprint(value):
    notebook = cell("def f():\n    return value\n", value=value)
    found = fingerprint(notebook["f"])
    assert found is not None and found.holds()


@pytest.mark.parametrize("value", [[1], {"a": 1}, {1}, bytearray(b"x"), (1, [2]), types.SimpleNamespace(),
                                   [].append, types.ModuleType("not_importable")])
def test_a_function_naming_anything_that_can_change_in_place_has_none(value):
    notebook = cell("def f():\n    return value\n", value=value)
    assert fingerprint(notebook["f"]) is None


def test_a_class_or_function_sent_by_value_is_taken_apart_or_refused():
    notebook = cell("""
        class Local:
            pass
        def helper():
            return 1
        def uses_class():
            return Local
        def uses_helper():
            return helper()
        def recursive(n):
            return n and recursive(n - 1)
    """)
    assert fingerprint(notebook["uses_class"]) is None   # its attributes may change: pickled each call
    found = fingerprint(notebook["uses_helper"])
    assert found is not None and len(found.functions) == 2
    assert fingerprint(notebook["recursive"]) is not None
    assert fingerprint(importable) is None   # pickled by reference: nothing to keep
    assert fingerprint(len) is None   # not a Python function


def test_every_part_of_a_function_pickle_that_changes_breaks_the_fingerprint():
    source = """
        import os
        n = 1
        def helper():
            return n
        def make(k):
            def f(a=1, *, b=2):
                return helper() + a + b + k + os.getpid() + m_missing_now
            return f
        f = make(5)
    """
    changes = {
        "a global rebound": lambda nb, f: nb.__setitem__("n", 1000 + len(nb)),
        "a global defined": lambda nb, f: nb.__setitem__("m_missing_now", 0),
        "a helper redefined": lambda nb, f: exec("def helper():\n    return 2\n", nb),
        "the code": lambda nb, f: setattr(f, "__code__", f.__code__.replace(co_name="g")),
        "the defaults": lambda nb, f: setattr(f, "__defaults__", (7,)),
        "a keyword default": lambda nb, f: f.__kwdefaults__.__setitem__("b", 9),
        "an attribute": lambda nb, f: setattr(f, "tag", "x"),
        "an annotation": lambda nb, f: f.__annotations__.__setitem__("a", "int"),
        "a closure cell": lambda nb, f: setattr(f.__closure__[0], "cell_contents", 6),
        "the name": lambda nb, f: setattr(f, "__qualname__", "other"),
        "the docstring": lambda nb, f: setattr(f, "__doc__", "now documented"),
    }
    for what, change in changes.items():
        notebook = cell(source)
        f = notebook["f"]
        found = fingerprint(f)
        assert found is not None and found.holds(), what
        change(notebook, f)
        assert not found.holds(), what


def test_a_package_global_breaks_the_fingerprint_when_modules_are_imported(monkeypatch):
    """cloudpickle sends the package's imported submodules along: a new one changes the pickle."""
    notebook = cell("import email\ndef f():\n    return email\n")
    found = fingerprint(notebook["f"])
    assert found is not None and found.holds()
    monkeypatch.setitem(sys.modules, "email.not_really_a_submodule", types.ModuleType("email.not_really_a_submodule"))
    assert not found.holds()


def test_code_that_writes_globals_is_told_nested_code_included():
    notebook = cell("""
        def reads():
            return n
        def writes():
            global n
            n = 1
        def deletes():
            global n
            del n
        def nested():
            def inner():
                global n
                n = 2
            return inner
    """)
    found = {name: fingerprint(notebook[name]) for name in ("reads", "writes", "deletes", "nested")}
    assert all(found.values())
    assert [name for name, each in found.items() if each is not None and each.writes_globals()] == \
        ["writes", "deletes", "nested"]


def test_the_notebook_keeps_a_pickle_while_its_fingerprint_holds():
    notebook = cell("n = 1\nitems = [1]\ndef f():\n    return n\ndef g():\n    return items\n")
    kept, made = KeptPickles(size=2), []

    def pickle(function):
        made.append(function)
        return shared_tensors.dumps(function, None)

    first = kept.dumps(notebook["f"], pickle)
    assert kept.dumps(notebook["f"], pickle) is first and len(made) == 1
    notebook["n"] = 2000
    assert kept.dumps(notebook["f"], pickle) != first and len(made) == 2
    assert kept.dumps(notebook["g"], pickle) is None and len(made) == 2   # pickled in the frame, afresh
    assert kept.dumps(notebook["g"], pickle) is None and id(notebook["g"]) in kept._refused   # looked at once
    notebook["items"] = (1,)   # no longer a list: kept from now on
    assert kept.dumps(notebook["g"], pickle) is not None and len(made) == 3
    assert kept.dumps(notebook["g"], pickle) is not None and len(made) == 3
    others = [cell("def h():\n    return 1\n")["h"] for _ in range(3)]
    for other in others:
        kept.dumps(other, pickle)
    assert len(kept._kept) == 2   # bounded: the oldest went
    big = cell("text = 'x' * (1 << 21)\ndef f():\n    return text\n")["f"]
    assert kept.dumps(big, pickle) is not None and id(big) not in kept._kept   # a big value is not kept twice


def test_a_rank_keeps_the_function_it_unpickled_only_when_no_call_can_change_it():
    notebook = cell("""
        def plain():
            return 1
        def counts(seen=[]):
            seen.append(1)
            return len(seen)
        def writes():
            global n
            n = 1
    """)
    loaded = LoadedFunctions()
    for name, kept in (("plain", True), ("counts", False), ("writes", False)):
        data = shared_tensors.dumps(notebook[name], None)
        first = loaded.loads(bytes(data), lambda raw: shared_tensors.loads(raw, None))
        second = loaded.loads(bytes(data), lambda raw: shared_tensors.loads(raw, None))
        assert (first is second) is kept, name
    data = shared_tensors.dumps(notebook["plain"], None)
    function = loaded.loads(data, lambda raw: shared_tensors.loads(raw, None))
    function.changed_by_a_call = True   # a call changed what was kept: unpickled afresh
    assert loaded.loads(data, lambda raw: shared_tensors.loads(raw, None)) is not function
    big = shared_tensors.dumps(cell("text = 'x' * (1 << 21)\ndef f():\n    return text\n")["f"], None)
    assert loaded.loads(big, lambda raw: shared_tensors.loads(raw, None)) is not \
        loaded.loads(big, lambda raw: shared_tensors.loads(raw, None))


def test_a_call_frame_with_a_kept_function_decodes_to_the_same_call():
    notebook = cell("scale = 3\ndef f(x, *, y):\n    return scale * x + y\n")
    for _ in range(2):   # made, then kept
        frame = command_frames.encode(commands.Command.CALL, Call(Job(notebook["f"], (2,), {"y": 1}), number=4))
        try:
            kind, wire = shared_tensors.loads(frame.data[commands.HEADER.size:], None)
        finally:
            frame.close()
        assert isinstance(wire[0], bytes)
        call = Call.from_wire(wire)
        assert kind == commands.Command.CALL.value and call.number == 4
        assert call.job.function(*call.job.args, **call.job.kwargs) == 7
        # the code keeps the file it came from (pickling.reduce_code): tracebacks name the cell
        assert call.job.function.__code__.co_filename == notebook["f"].__code__.co_filename == "<cell 3>"
