"""The notebook's half of the command format (``channels.commands``): a command and its payload
pickled once into a frame that goes to every rank, big tensors' bytes into a fresh memfd beside it
(``shared_tensors``). Here, on the side that encodes, because channels/ imports nothing of ours
and the pickling with tensors is ``shared_tensors``'s; the rank decodes with the same module
(``rank.serve.receive_command``, ``engines.remote.serve.decode``)."""
from __future__ import annotations

import os
from typing import Any

from ..wire import function_pickles, shared_tensors
from ..channels.commands import Command, Frame, close_fd
from ..rank.serve import Call


def encode(command: Command, payload: Any) -> Frame:
    """One frame; encode once and send the same frame to every rank. Big tensors' bytes go
    to a fresh memfd (one copy, at memory speed), the rest into the bytes. A CALL's payload,
    a ``rank.serve.Call``, travels as ``Call.wire()`` (the ranks' decoders rebuild it), its
    function as the bytes of its own pickle when ``function_pickles`` may keep them."""
    import cloudpickle
    if isinstance(payload, Call):
        payload = _with_kept_function(payload.wire())
    made: list[int | None] = []   # the memfd, made when the first big part comes (most calls: none)

    def make() -> int | None:
        made.append(shared_tensors.create_file())
        return made[0]

    fd: int | None = None
    try:
        data = shared_tensors.dumps((Command(command).value, payload), make, base=cloudpickle.Pickler)
        fd = made[0] if made else None
        if fd is not None and os.fstat(fd).st_size == 0:
            close_fd(fd)
            fd = None
    except BaseException:
        fd = made[0] if made else None
        if fd is not None:
            close_fd(fd)
        raise
    return Frame.of(data, fd)


def _with_kept_function(wire: tuple[Any, ...]) -> tuple[Any, ...]:
    """``wire`` with its function replaced by the bytes of its pickle, made once and kept while
    nothing in it can change (``function_pickles.KeptPickles``); as it is for any other function."""
    data = function_pickles.kept.dumps(wire[0], _pickle_function)
    return wire if data is None else (data, *wire[1:])


def _pickle_function(function: Any) -> bytes:
    import cloudpickle
    return shared_tensors.dumps(function, None, base=cloudpickle.Pickler)
