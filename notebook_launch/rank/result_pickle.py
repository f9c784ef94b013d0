"""How a rank serializes its return value for the notebook.

cloudpickle copies classes of ``__main__`` by value: right for a spawned rank,
whose ``__main__`` is not the notebook's. A forked rank's ``__main__`` is a copy
of the notebook's, so the notebook already holds every class defined in a
cell; pickling those by reference makes a returned dataclass, Enum or
NamedTuple an instance of the notebook's own class (``isinstance``, ``==`` and
``is`` then work as the user expects).
"""
from __future__ import annotations

import io
import pickle
import sys
from typing import Any

import cloudpickle


def _defined_in_main(cls: type) -> bool:
    """A class the notebook reaches as ``__main__.<qualname>`` (not a class local to a function)."""
    if getattr(cls, "__module__", None) != "__main__":
        return False
    found: Any = sys.modules.get("__main__")
    for part in getattr(cls, "__qualname__", "").split("."):
        found = getattr(found, part, None)
    return found is cls


class _MainClassesByReference(cloudpickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, type) and _defined_in_main(obj):
            return NotImplemented   # pickle's own save_global: by reference
        return super().reducer_override(obj)


def pickler_base(main_classes_by_reference: bool) -> type:
    """The pickler a result is written with (shared_tensors adds its tensor handling on top)."""
    return _MainClassesByReference if main_classes_by_reference else cloudpickle.Pickler


def dumps(value: Any, *, main_classes_by_reference: bool) -> bytes:
    """``value`` pickled for the notebook; with ``main_classes_by_reference`` (fork)
    the notebook's own classes are named, not copied."""
    if not main_classes_by_reference:
        return cloudpickle.dumps(value)
    buffer = io.BytesIO()
    _MainClassesByReference(buffer, protocol=pickle.DEFAULT_PROTOCOL).dump(value)
    return buffer.getvalue()
