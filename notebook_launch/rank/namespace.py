"""Inside a persistent rank: the one namespace that lives across calls and cells.

It is the rank's ``__main__`` dict (under fork, a copy of the notebook's globals
at start). A function defined in the notebook travels by value (cloudpickle)
with the notebook's current values of the globals it names; here it is rebound
to the rank's namespace, so ``global model; model = ...`` in one call is seen
by the next. Rule for a name both sides have: a name the rank assigned (in a
call, a ``%%ranks`` cell or ``push``) is the rank's and wins; any other name
takes the notebook's value of this call.
"""
from __future__ import annotations

import ast
import linecache
import os
import sys
import types
from collections.abc import Collection, Iterable, Mapping
from typing import Any

_IGNORED = frozenset({"__builtins__", "__name__", "__doc__", "__package__", "__loader__", "__spec__"})


class RankNamespace:
    """The rank's persistent globals and the names the rank owns."""

    def __init__(self, globals_dict: dict[str, Any]) -> None:
        self.globals = globals_dict
        self.owned: set[str] = set()

    def merge(self, values: Mapping[str, Any]) -> None:
        """Take the notebook's values of names the rank does not own."""
        for name, value in values.items():
            if name not in _IGNORED and name not in self.owned:
                self.globals[name] = value

    def adopt(self, function: Any) -> Any:
        """A notebook function that arrived by value, rebound to this namespace, and so are
        the notebook functions it names (cloudpickle gave them one shared globals dict, which
        also brought the notebook's values: those are merged first). Anything else is returned
        as it is."""
        if not self._by_value(function):
            return function
        shipped = function.__globals__
        rebound = {name: self._rebind(value) for name, value in shipped.items()
                   if self._by_value(value) and value.__globals__ is shipped}
        self.merge({**shipped, **rebound})
        return self._rebind(function)

    def _by_value(self, value: Any) -> bool:
        return isinstance(value, types.FunctionType) and value.__module__ == "__main__" \
            and value.__globals__ is not self.globals

    def _rebind(self, function: types.FunctionType) -> types.FunctionType:
        rebound = types.FunctionType(function.__code__, self.globals, function.__name__,
                                     function.__defaults__, function.__closure__)
        rebound.__kwdefaults__ = function.__kwdefaults__
        rebound.__qualname__ = function.__qualname__
        rebound.__doc__ = function.__doc__
        rebound.__dict__.update(function.__dict__)
        return rebound

    def snapshot(self) -> tuple[list[str], list[int]]:
        """The names and the ids of their values, in the dict's order (ids, not the values: a
        call that deletes a global must free it). Built by C loops: a notebook's namespace holds
        hundreds of names, and this runs in every call (issue 45)."""
        return list(self.globals), list(map(id, self.globals.values()))

    def own_changes(self, before: tuple[list[str], list[int]]) -> None:
        """Names a call created or rebound are the rank's from now on. Most calls change no
        global: the same names in the same order with the same ids say so without a Python loop
        (a rebound name keeps its place in the dict, a new one comes last)."""
        names, ids = before
        if list(self.globals) == names and list(map(id, self.globals.values())) == ids:
            return
        was = dict(zip(names, ids))
        for name, value in self.globals.items():
            if was.get(name) != id(value) and name not in _IGNORED:
                self.owned.add(name)


_namespace: RankNamespace | None = None


def current() -> RankNamespace:
    """This rank's namespace (created on first use from ``__main__``)."""
    global _namespace
    if _namespace is None:
        main = sys.modules.get("__main__")
        _namespace = RankNamespace(main.__dict__ if main is not None else {"__name__": "__main__"})
    return _namespace


# --- what push, pull and %%ranks run in the rank (module functions: pickled by reference) ---

def unpicklable(values: Mapping[str, Any]) -> dict[str, str]:
    """(In the notebook) the names whose values cannot be sent (as ``shared_tensors.dumps`` sends
    them: an open file is refused, not copied), and why."""
    from ..wire.pickling import pickle_error
    unsent = {}
    for name, value in values.items():
        error = pickle_error(value)
        if error is not None:
            unsent[name] = f"{type(error).__name__}: {error}"
    return unsent


def push(values: Mapping[str, Any]) -> None:
    namespace = current()
    namespace.globals.update(values)
    namespace.owned.update(values)


def pull(names: Iterable[str]) -> Any:
    """One name: its value; several: a dict of them."""
    names = list(names)
    namespace = current()
    missing = [n for n in names if n not in namespace.globals]
    if missing:
        raise NameError(f"{', '.join(map(repr, missing))} not defined in this rank's namespace "
                        f"(assign it in a call or a %%ranks cell, or push it first)")
    if len(names) == 1:
        return namespace.globals[names[0]]
    return {n: namespace.globals[n] for n in names}


class _NotRun:
    """What a rank outside a ``%%ranks --ranks`` subset returns: one object, which pickles by
    reference, so ``value is NotRun`` holds in the notebook too."""

    def __repr__(self) -> str:
        return "NotRun"

    def __reduce__(self) -> str:
        return "NotRun"


NotRun = _NotRun()


def run_cell(source: str, filename: str, values: Mapping[str, Any], unsent: Mapping[str, str] | None = None,
             ranks: Collection[int] | None = None) -> Any:
    """Run a ``%%ranks`` cell body in the namespace, with the notebook values it names, and
    return the value of its last line when that is an expression (as IPython shows a cell's
    result; None otherwise, or when the source ends with ``;``). ``unsent``: names whose
    notebook value could not be sent, and why; the rank's own value is used, and a name the
    rank does not have stops the cell before any of it runs. ``ranks``: the global ranks that
    run it; any other rank returns ``NotRun`` at once, touching nothing."""
    if ranks is not None and int(os.environ.get("RANK", "0")) not in ranks:
        return NotRun
    namespace = current()
    missing = {name: why for name, why in (unsent or {}).items() if name not in namespace.globals}
    if missing:
        raise NameError("; ".join(
            f"name {name!r} is not defined in this rank: the notebook's value could not be sent ({why})"
            for name, why in missing.items()) + ". Create it in the ranks (in a %%ranks cell) or pass a "
            "value that pickles; the cell did not run")
    namespace.merge(values)
    if filename not in linecache.cache:   # tracebacks in the rank show the cell's lines
        linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    tree = ast.parse(source, filename)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    assert last is None or isinstance(last, ast.Expr)
    exec(compile(tree, filename, "exec"), namespace.globals)
    if last is None:
        return None
    value = eval(compile(ast.Expression(last.value), filename, "eval"), namespace.globals)
    return None if source.rstrip().endswith(";") else _sendable(value)


class ShownAs:
    """A cell's value that does not pickle, sent back as its repr (the cell ran; only its
    display is at stake, so that is no error)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _sendable(value: Any) -> Any:
    """``value``, or its repr when it cannot be pickled. Tensors and arrays are not tried
    (they pickle, at memory speed through the result's memfd)."""
    if value is None or isinstance(value, (int, float, complex, str, bytes)) \
            or type(value).__module__.split(".")[0] in ("torch", "numpy"):
        return value
    import cloudpickle
    try:
        cloudpickle.dumps(value)
    except Exception:   # why: anything cloudpickle cannot carry is shown by its repr
        return ShownAs(repr(value))
    return value
