"""A forked rank's environment, built whole in the notebook before the fork (issue 45).

A rank adds its 24 variables (RANK, MASTER_PORT, ...) to the environment it inherited. Set one
at a time in the rank (``putenv``, and ``os.environ``'s dict), that cost about 0.5 ms of each
rank's CPU: the C library grows its ``environ`` array a variable at a time (a new array and a
copy for each one it adds) and the dict grows as well, and most of the cost is the notebook's
pages those writes touch, copied after the fork. So the notebook builds each rank's complete
environment before its forks, both as the C library keeps it (a NULL-ended array of ``NAME=value``
strings) and as ``os.environ`` keeps it (a dict of encoded names and values), and the rank only
points ``environ`` and ``os.environ`` at them: two pointer writes.

What a rank then sees is what ``putenv`` and ``os.environ.update`` would have left: the C
environment the notebook had at its forks (variables set from C or with ``os.putenv`` alone
included) with the rank's variables replacing or added to it, and the notebook's ``os.environ``
with them. The C library copes with an ``environ`` it did not allocate (glibc's ``setenv``
copies it into an array of its own at the first variable added; ``unsetenv`` and a changed
value write into it in place), so the rank's later ``os.environ[...] = ...``, ``putenv`` and
``unsetenv`` work as in any process, and child processes (``subprocess``, ``os.system``) get
the array as their environment.
"""
from __future__ import annotations

import array
import ctypes
import itertools
import os
import sys
from typing import Any

from .bootstrap import EncodedEnvironment, encode_environment, set_environment as put_environment


def _c_environ() -> tuple[Any, Any] | None:
    """(``environ`` as a ``char **``, the same variable as a ``void *``) of the C library, made
    once in the notebook: a rank finds them ready. None where they cannot be reached."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        return (ctypes.POINTER(ctypes.c_char_p).in_dll(libc, "environ"),
                ctypes.c_void_p.in_dll(libc, "environ"))
    except (OSError, ValueError, AttributeError):
        return None


_ENVIRON = _c_environ()
Inherited = list[tuple[bytes, bytes]]   # (name, NAME=value) of each C variable, in order
# in a rank: the environment it replaced, never freed (its pages stay shared), and the one it put in,
# whose buffers libc's environ points into for the rank's whole life, whatever its caller keeps
_REPLACED: list[Any] = []


_POINTER = "Q" if ctypes.sizeof(ctypes.c_void_p) == 8 else "I"   # array's type code of a C pointer


class PreparedEnvironment:
    """One rank's whole environment, built in the notebook (``prepare``); ``install`` in the rank.
    The C side is one buffer of NUL-ended ``NAME=value`` strings and an array of pointers into it
    (made with C loops: a ctypes array of ``c_char_p`` took 30 µs per rank to fill)."""

    __slots__ = ("text", "pointers", "data", "address")

    def __init__(self, strings: list[bytes], data: dict[bytes, bytes]) -> None:
        self.text = ctypes.create_string_buffer(b"\0".join(strings))   # one more NUL at its end
        base = ctypes.addressof(self.text)
        starts = itertools.accumulate((len(entry) + 1 for entry in strings[:-1]), initial=0)
        self.pointers = array.array(_POINTER, [base + start for start in starts] if strings else [])
        self.pointers.append(0)   # environ ends with a NULL
        self.data = data
        self.address = self.pointers.buffer_info()[0]


def inherited_c_environment() -> Inherited | None:
    """(name, ``NAME=value``) of each variable of the C library's environment now, in its order;
    read once per launch, just before the forks. None where it cannot be read."""
    if _ENVIRON is None or not isinstance(getattr(os.environ, "_data", None), dict):
        return None
    entries: Inherited = []
    array, index = _ENVIRON[0], 0
    if not array:
        return []
    while True:
        entry = array[index]
        if entry is None:
            return entries
        entries.append((entry.partition(b"=")[0], entry))
        index += 1


def prepare(env: dict[str, str], inherited: Inherited | None) -> PreparedEnvironment | EncodedEnvironment:
    """The rank's complete environment: ``inherited`` (``inherited_c_environment``) and the
    notebook's ``os.environ``, each with ``env`` replacing or added. Where the C environment
    could not be read, or a name or value is one ``putenv`` refuses (an empty name, one with
    ``=``, a NUL byte), the pairs for ``putenv`` (``bootstrap.encode_environment``), which then
    refuses it in the rank as before."""
    pairs = encode_environment(env)
    if inherited is None or _refused(pairs):
        return pairs
    own = dict(pairs)
    strings = [name + b"=" + own[name] if name in own else entry for name, entry in inherited]
    seen = {name for name, _ in inherited}
    strings += [name + b"=" + value for name, value in pairs if name not in seen]
    data = dict(os.environ._data)  # type: ignore[attr-defined]
    data.update(pairs)
    return PreparedEnvironment(strings, data)


def _refused(pairs: EncodedEnvironment) -> bool:
    """Whether ``putenv`` would refuse one of ``pairs``: an empty name, one with ``=``, a NUL."""
    names = [name for name, _ in pairs]
    return not all(names) or b"=" in b"".join(names) or b"\0" in b"".join(b"".join(pair) for pair in pairs)


def install(env: PreparedEnvironment | EncodedEnvironment) -> None:
    """In the rank: make ``env`` this process's environment (``prepare``'s; pairs are ``putenv``'d).
    The dict it replaces is kept, not freed: freeing it would write to every page it spans."""
    if not isinstance(env, PreparedEnvironment) or _ENVIRON is None:   # (prepare gives pairs then)
        put_environment(env if not isinstance(env, PreparedEnvironment) else tuple(env.data.items()))
        return
    _REPLACED.extend((os.environ._data, env))  # type: ignore[attr-defined]
    _ENVIRON[1].value = env.address
    os.environ._data = env.data  # type: ignore[attr-defined]
    environb = getattr(os, "environb", None)
    if environb is not None:
        environb._data = env.data   # os.environb shares os.environ's dict
