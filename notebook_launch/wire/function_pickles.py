"""A CALL's function pickled once and kept, on both sides, while it provably cannot differ (issue 45).

The notebook (``KeptPickles``, used by ``persistent.command_frames.encode``): a function sent
by value whose ``function_fingerprint.Fingerprint`` still holds is not pickled again; the bytes
of its last pickle travel in the frame in its place (the call's arguments are pickled afresh,
always). A function whose pickle could change in place (it names a list, an array, an object)
has no fingerprint and is pickled inside the frame as before, at every call.

A rank (``LoadedFunctions``, used by ``rank.serve.Call.from_wire``): the same bytes unpickle to
the same function, so the one unpickled last time is used again, unless its code assigns or
deletes a global or anything it carries is mutable (then it is unpickled afresh, as before: a
call could have changed what the next one would see), or its fingerprint, taken when it was
unpickled, no longer holds (a call changed it).

One difference from pickling the function inside the frame: objects the function's pickle shares
with the arguments' arrive as equal objects, not as one. Only immutable ones can be shared that
way (strings, numbers, tuples, importable names), and notebook functions the arguments carry are
rebound to the rank's namespace (``rank.namespace``) either way.
"""
from __future__ import annotations

import threading
import types
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from .function_fingerprint import Fingerprint, fingerprint, mutable_global

# How many functions each side keeps: a notebook alternates between a few; each is small.
KEPT = 16
# A pickle at least this big is not kept (nor the function unpickled from it): it names a big
# str or bytes, which the kept bytes would copy and the fingerprint keep alive after the notebook
# let go of it; pickling such a value is copying it, which the kept bytes save little of.
KEPT_BYTES = 1 << 20


class KeptPickles:
    """The notebook's side: each by-value function's last pickle and the fingerprint it was made
    under, by the function's id (the entry holds the function, so the id stays its own)."""

    def __init__(self, size: int = KEPT) -> None:
        self._size = size
        self._kept: OrderedDict[int, tuple[Any, Fingerprint, bytes]] = OrderedDict()
        # Functions found to name a mutable global: (function, its code, the name, the value); while
        # the name holds the same object, there is no fingerprint to look for (a training function
        # naming the model and optimizer: most of a notebook's calls)
        self._refused: OrderedDict[int, tuple[Any, Any, str, Any]] = OrderedDict()
        self._lock = threading.Lock()

    def dumps(self, function: Any, pickle: Callable[[Any], bytes]) -> bytes | None:
        """``function``'s pickle (made by ``pickle``, or the one kept from an earlier call while
        nothing in it can have changed); None for a function that must be pickled inside the
        frame, afresh (no fingerprint: see ``function_fingerprint``)."""
        with self._lock:
            kept = self._kept.get(id(function))
            if kept is not None and kept[0] is function and kept[1].holds():
                self._kept.move_to_end(id(function))
                return kept[2]
            self._kept.pop(id(function), None)
            if self._still_refused(function):
                return None
        found = fingerprint(function)   # taken before pickling: a change in between shows next time
        if found is None:
            self._refuse(function)
            return None
        data = pickle(function)
        if len(data) >= KEPT_BYTES:
            return data
        with self._lock:
            self._kept[id(function)] = (function, found, data)
            while len(self._kept) > self._size:
                self._kept.popitem(last=False)
        return data

    def _still_refused(self, function: Any) -> bool:
        refused = self._refused.get(id(function))
        if refused is None:
            return False
        if refused[0] is function and function.__code__ is refused[1] \
                and function.__globals__.get(refused[2], refused) is refused[3]:
            return True
        del self._refused[id(function)]
        return False

    def _refuse(self, function: Any) -> None:
        try:
            found = mutable_global(function) if type(function) is types.FunctionType else None
        except Exception:   # why: only a shortcut; without it the next call looks again
            found = None
        if found is not None:
            with self._lock:
                self._refused[id(function)] = (function, function.__code__, *found)
                while len(self._refused) > self._size:
                    self._refused.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()
            self._refused.clear()


class LoadedFunctions:
    """A rank's side: the function unpickled from each of the last few function pickles, kept
    only when nothing a call does can change what the next call would unpickle."""

    def __init__(self, size: int = KEPT) -> None:
        self._size = size
        self._loaded: OrderedDict[bytes, tuple[Any, Fingerprint]] = OrderedDict()
        self._lock = threading.Lock()

    def loads(self, data: bytes, load: Callable[[bytes], Any]) -> Any:
        """The function ``data`` pickles: the one unpickled from the same bytes before when it
        is still as it was, else ``load(data)``."""
        with self._lock:
            loaded = self._loaded.get(data)
            if loaded is not None and loaded[1].holds():
                self._loaded.move_to_end(data)
                return loaded[0]
            self._loaded.pop(data, None)
        function = load(data)
        found = fingerprint(function) if len(data) < KEPT_BYTES else None
        if found is not None and not found.writes_globals():
            with self._lock:
                self._loaded[data] = (function, found)
                while len(self._loaded) > self._size:
                    self._loaded.popitem(last=False)
        return function

    def clear(self) -> None:
        with self._lock:
            self._loaded.clear()


kept = KeptPickles()        # the notebook's
loaded = LoadedFunctions()  # this rank's
