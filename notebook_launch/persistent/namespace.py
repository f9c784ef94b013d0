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

import linecache
import sys
import types
from collections.abc import Iterable, Mapping
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

    def snapshot(self) -> dict[str, int]:
        return {name: id(value) for name, value in self.globals.items()}

    def own_changes(self, before: Mapping[str, int]) -> None:
        """Names a call created or rebound are the rank's from now on."""
        for name, value in self.globals.items():
            if before.get(name) != id(value) and name not in _IGNORED:
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
    """(In the notebook) the names whose values cloudpickle cannot send, and why."""
    import cloudpickle
    unsent = {}
    for name, value in values.items():
        try:
            cloudpickle.dumps(value)
        except Exception as exc:
            unsent[name] = f"{type(exc).__name__}: {exc}"
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


def run_cell(source: str, filename: str, values: Mapping[str, Any], unsent: Mapping[str, str] | None = None) -> None:
    """Run a ``%%ranks`` cell body in the namespace, with the notebook values it names.
    ``unsent``: names whose notebook value could not be sent, and why; the rank's own value
    is used, and a name the rank does not have stops the cell before any of it runs."""
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
    exec(compile(source, filename, "exec"), namespace.globals)
