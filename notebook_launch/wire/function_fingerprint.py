"""When a notebook function's pickle provably cannot differ from last time (issue 45).

cloudpickle sends a function defined in the notebook (``__main__``) by value: its code, its
defaults, its ``__dict__``, its closure's contents and the globals its code names, each as it is
now. A warm ``ranks.run(f)`` spent about a quarter of the notebook's encoding of a call on
that, again and again for the same function; each rank as much unpickling it. A ``Fingerprint``
says whether all of it is still what it was: the same objects (compared by identity; the
fingerprint holds them, so an id cannot be reused), each immutable by type, so the same objects
pickle to the same bytes. Anything that could change in place (a list, a dict, an array, an
object, a class sent by value) makes ``fingerprint`` answer None: such a function is pickled
afresh at every call, as before, so a call always sees the values of its time.

Immutable here: int, float, complex, bool, None, str, bytes, tuples and frozensets of those,
and what pickles as a name (an importable module, function or class, a module's builtin
function). A function sent by value that the function names (a helper, itself) is taken apart
the same way, recursively. Both sides use this: the notebook to keep a function's bytes
(``function_pickles.KeptPickles``), a rank to keep the function it unpickled from the same
bytes (``function_pickles.LoadedFunctions``).
"""
from __future__ import annotations

import dis
import sys
import types
import weakref
from typing import Any

_MISSING = object()   # a name the function's globals lack, an empty cell, an absent attribute
_SCALARS = frozenset({int, float, complex, bool, type(None), str, bytes})
_COLLECTIONS = frozenset({tuple, frozenset})
# What cloudpickle puts in a by-value function's globals besides the names its code reads
_MODULE_NAMES = ("__package__", "__name__", "__path__", "__file__")
_WRITES = frozenset({dis.opmap["STORE_GLOBAL"], dis.opmap["DELETE_GLOBAL"]})
_should_pickle_by_reference: Any = None
_writes_cache: weakref.WeakKeyDictionary[types.CodeType, bool] = weakref.WeakKeyDictionary()


def _by_reference(value: Any) -> bool:
    """Whether cloudpickle pickles ``value`` (a module, function or class) as a name."""
    global _should_pickle_by_reference
    if _should_pickle_by_reference is None:   # cloudpickle is imported only when something is pickled
        from cloudpickle import cloudpickle as implementation
        _should_pickle_by_reference = implementation._should_pickle_by_reference
    return bool(_should_pickle_by_reference(value))


def _snapshot(mapping: dict[str, Any] | None) -> tuple[tuple[str, Any], ...] | None:
    return None if mapping is None else tuple(mapping.items())


def _same_items(mapping: dict[str, Any] | None, items: tuple[tuple[str, Any], ...] | None) -> bool:
    if mapping is None or items is None:
        return mapping is None and items is None
    if len(mapping) != len(items):
        return False
    for key, value in items:   # loops, not all(): this runs at every call
        if mapping.get(key, _MISSING) is not value:
            return False
    return True


class _FunctionParts:
    """One by-value function's parts as they were: what ``_function_getstate`` pickles of it."""

    __slots__ = ("function", "code", "defaults", "kwdefaults", "kwdefaults_items", "attributes",
                 "annotations", "annotations_items", "closure", "cells", "names", "strings")

    def __init__(self, function: types.FunctionType) -> None:
        from cloudpickle import cloudpickle as implementation
        self.function = function
        self.code = function.__code__
        self.defaults = function.__defaults__
        self.kwdefaults = function.__kwdefaults__
        self.kwdefaults_items = _snapshot(self.kwdefaults)
        self.attributes = _snapshot(function.__dict__)
        self.annotations = function.__annotations__
        self.annotations_items = _snapshot(self.annotations)
        self.closure = function.__closure__
        self.cells = tuple(_cell_contents(cell) for cell in self.closure or ())
        shipped = function.__globals__
        names = (*implementation._extract_code_globals(self.code), *_MODULE_NAMES)
        self.names = tuple((name, shipped.get(name, _MISSING)) for name in names)
        self.strings = (function.__name__, function.__qualname__, function.__module__, function.__doc__)

    def values(self) -> list[Any]:
        """Everything of the function that is pickled with it, to be checked for immutability."""
        values: list[Any] = [*(self.defaults or ()), *self.cells, *self.strings]
        for items in (self.kwdefaults_items, self.attributes, self.annotations_items):
            values += [value for _, value in items or ()]
        values += [value for _, value in self.names if value is not _MISSING]
        return values

    def holds(self) -> bool:
        function = self.function
        if function.__code__ is not self.code or function.__defaults__ is not self.defaults \
                or function.__kwdefaults__ is not self.kwdefaults or function.__closure__ is not self.closure \
                or function.__annotations__ is not self.annotations or function.__name__ is not self.strings[0] \
                or function.__qualname__ is not self.strings[1] or function.__module__ is not self.strings[2] \
                or function.__doc__ is not self.strings[3]:
            return False
        if not (_same_items(self.kwdefaults, self.kwdefaults_items) and _same_items(function.__dict__, self.attributes)
                and _same_items(self.annotations, self.annotations_items)):
            return False
        if self.closure is not None:
            for cell, value in zip(self.closure, self.cells):
                if _cell_contents(cell) is not value:
                    return False
        shipped = function.__globals__
        for name, value in self.names:
            if shipped.get(name, _MISSING) is not value:
                return False
        return True


def _cell_contents(cell: types.CellType) -> Any:
    try:
        return cell.cell_contents
    except ValueError:   # an empty cell
        return _MISSING


class Fingerprint:
    """A by-value function's pickle, as parts compared by identity (``holds``). ``functions``: it
    and every by-value function it names; ``by_reference``: what pickles as a name, checked to
    still do so; ``modules``: the size of ``sys.modules`` when the function names a package,
    whose imported submodules cloudpickle sends along (``_find_imported_submodules``)."""

    def __init__(self, functions: list[_FunctionParts], by_reference: list[Any], modules: int | None) -> None:
        self.functions = functions
        self.by_reference = by_reference
        self.modules = modules

    def holds(self) -> bool:
        """Whether the function would pickle to the same bytes as when this was taken."""
        try:
            if self.modules is not None and len(sys.modules) != self.modules:
                return False
            for parts in self.functions:
                if not parts.holds():
                    return False
            for value in self.by_reference:
                if not _by_reference(value):
                    return False
            return True
        except Exception:   # why: an attribute that cannot be read now; pickle afresh
            return False

    def writes_globals(self) -> bool:
        """Whether any of its code (nested code included) assigns or deletes a global."""
        return any(_writes_globals(parts.code) for parts in self.functions)


def _writes_globals(code: types.CodeType) -> bool:
    known = _writes_cache.get(code)
    if known is None:
        known = any(instruction.opcode in _WRITES for instruction in dis.get_instructions(code)) \
            or any(_writes_globals(const) for const in code.co_consts if isinstance(const, types.CodeType))
        _writes_cache[code] = known
    return known


class _Walk:
    """Takes a function apart into a Fingerprint; ``admit`` says whether a value is immutable."""

    def __init__(self) -> None:
        self.functions: dict[int, _FunctionParts] = {}
        self.by_reference: list[Any] = []
        self.packages = False

    def function(self, function: types.FunctionType) -> bool:
        if id(function) in self.functions:   # recursion, or a helper named twice
            return True
        parts = self.functions[id(function)] = _FunctionParts(function)
        direct = [*parts.cells, *(value for _, value in parts.names)]
        self.packages = self.packages or any(isinstance(value, types.ModuleType) and getattr(value, "__package__", None)
                                             for value in direct)
        return all(self.admit(value) for value in parts.values())

    def admit(self, value: Any) -> bool:
        kind = type(value)
        if kind in _SCALARS:
            return True
        if kind in _COLLECTIONS:
            return all(self.admit(item) for item in value)
        if kind is types.FunctionType:
            if _by_reference(value):
                self.by_reference.append(value)
                return True
            return self.function(value)
        if kind is types.ModuleType or isinstance(value, type):
            if _by_reference(value):
                self.by_reference.append(value)
                return True
            return False
        if kind is types.BuiltinFunctionType:   # pickled as its module's attribute, e.g. math.sqrt
            return isinstance(value.__self__, types.ModuleType)
        return False


def _refused_by_type(value: Any) -> bool:
    """Whether ``_Walk.admit`` refuses ``value`` whatever its contents: by its type alone."""
    kind = type(value)
    return not (kind in _SCALARS or kind in _COLLECTIONS or isinstance(value, type)
                or kind in (types.FunctionType, types.ModuleType, types.BuiltinFunctionType))


def mutable_global(function: types.FunctionType) -> tuple[str, Any] | None:
    """A global the function's code names whose value is refused by its type alone (a list, a
    model, an optimizer): while the name holds that object, the function has no fingerprint."""
    from cloudpickle import cloudpickle as implementation
    shipped = function.__globals__
    for name in implementation._extract_code_globals(function.__code__):
        value = shipped.get(name, _MISSING)
        if value is not _MISSING and _refused_by_type(value):
            return name, value
    return None


def fingerprint(function: Any) -> Fingerprint | None:
    """The fingerprint of a function cloudpickle sends by value; None when there is none to
    keep: not such a function, or some part of its pickle could change in place."""
    if type(function) is not types.FunctionType:
        return None
    walk = _Walk()
    try:
        if _by_reference(function) or not walk.function(function):
            return None
    except Exception:   # why: a RecursionError (a deep tuple), an attribute that cannot be read
        return None
    return Fingerprint(list(walk.functions.values()), walk.by_reference,
                       len(sys.modules) if walk.packages else None)
