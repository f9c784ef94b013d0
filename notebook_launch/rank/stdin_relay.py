"""A rank's stdin: ``input()``, ``getpass()``, ``sys.stdin`` and pdb ask the notebook, a line at a time.

A rank has no terminal, and in a kernel it cannot reach the frontend (ipykernel drops
messages sent from a forked process). So a read sends an INPUT_REQUEST event to the
parent over the rank's event pipe and waits for the answer on its answers pipe; the
parent's supervisor puts the prompt to its frontend (the cell's input box, or the
terminal) and writes the answer back. Where the frontend cannot answer, the answer is
an error, raised here as StdinUnavailableError: a read nobody will answer never hangs.
fd 0 reads /dev/null, so C code or a subprocess that reads it gets end-of-file at once.
"""
from __future__ import annotations

import builtins
import getpass
import io
import logging
import os
import sys

from ..wire import protocol
from ..errors.best_effort import best_effort
from ..wire.fork_locks import ForkRenewedLock

log = logging.getLogger("notebook_launch")
_one_prompt_at_a_time = ForkRenewedLock()


class StdinUnavailableError(RuntimeError):
    """Raised in a rank that reads stdin where the notebook's frontend cannot answer.

    A RuntimeError like ipykernel's StdinNotImplementedError, not an EOFError: pdb treats
    EOFError as "quit" and would hide the reason; this one reaches the user."""


def ask(prompt: str, *, password: bool = False, caller: str = "input()") -> str:
    """Put ``prompt`` to the notebook's frontend and return the line typed (no newline).
    Raises EOFError when the user ends input, StdinUnavailableError when nobody can answer."""
    writer = protocol.current()
    if writer is None:
        raise StdinUnavailableError(f"{caller} in a rank needs the launch's event channel, which is gone")
    for stream in (sys.stdout, sys.stderr):  # what the rank printed shows before the prompt
        with best_effort("could not flush %r before a prompt", stream):
            stream.flush()
    with _one_prompt_at_a_time:
        request: protocol.InputRequestPayload = {"prompt": prompt, "password": password, "caller": caller}
        writer.send(protocol.EventKind.INPUT_REQUEST, request)
        if writer.answers_fd is None:
            raise StdinUnavailableError(f"{caller} in this rank has no way to get an answer from the notebook")
        reply = _read_reply(writer.answers_fd)
    if "line" in reply:
        return reply["line"]
    if "unavailable" in reply:
        raise StdinUnavailableError(reply["unavailable"])
    raise EOFError(reply.get("eof") or "end of input")


def _read_reply(fd: int) -> protocol.InputReplyPayload:
    reader = protocol.EventReader()
    while True:
        data = os.read(fd, 4096)
        if not data:
            raise StdinUnavailableError("the notebook closed the rank's channel while it waited for input")
        for kind, payload in reader.feed(data):
            if kind is protocol.EventKind.INPUT_REPLY:
                reply: protocol.InputReplyPayload = payload
                return reply


def rank_input(prompt: object = "") -> str:
    """builtins.input of a rank."""
    return ask(str(prompt), caller="input()")


def rank_getpass(prompt: str = "Password: ", stream: object = None) -> str:
    """getpass.getpass of a rank: the frontend hides what is typed."""
    return ask(str(prompt), password=True, caller="getpass()")


class RankStdin(io.TextIOBase):
    """sys.stdin of a rank: every line read is one prompt in the notebook."""

    encoding = "utf-8"

    def readable(self) -> bool:
        return True

    def readline(self, size: int | None = -1) -> str:  # type: ignore[override]
        try:
            return ask("", caller="sys.stdin") + "\n"
        except EOFError:
            return ""

    def read(self, size: int | None = -1) -> str:
        """Lines until end of input (or until ``size`` characters): one prompt per line."""
        lines: list[str] = []
        count = 0
        while size is None or size < 0 or count < size:
            line = self.readline()
            if not line:
                break
            lines.append(line)
            count += len(line)
        return "".join(lines)

    def fileno(self) -> int:
        raise io.UnsupportedOperation("a rank's sys.stdin asks the notebook a line at a time; it has no fd")


def install(spec: object = None) -> None:
    """Route the rank's reads of stdin to the notebook (a rank hook: ``spec`` is not needed)."""
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        if null != 0:
            os.dup2(null, 0)
            os.close(null)
    except OSError:
        log.debug("could not point fd 0 of the rank at /dev/null", exc_info=True)
    sys.stdin = sys.__stdin__ = RankStdin()  # type: ignore[misc,assignment]
    builtins.input = rank_input
    getpass.getpass = rank_getpass
    _route_the_forked_kernel()
    if getattr(sys.breakpointhook, "__module__", "").startswith("debugpy"):
        # ipykernel's debugpy hook does nothing without a debugger attached to this process
        sys.breakpointhook = sys.__breakpointhook__


def _route_the_forked_kernel() -> None:
    """A rank forked from a Jupyter kernel still holds the kernel object; code that kept
    ``kernel.raw_input`` or ``kernel.getpass`` (e.g. a ``from getpass import getpass`` run in a
    cell) would send from the fork, which ipykernel drops, and wait forever. Both end in
    ``_input_request``: route that instance method to ``ask``."""
    kernelapp = sys.modules.get("ipykernel.kernelapp")
    app = getattr(getattr(kernelapp, "IPKernelApp", None), "_instance", None)
    kernel = getattr(app, "kernel", None)
    if kernel is None:
        return

    def input_request(prompt: str, ident: object, parent: object, password: bool = False) -> str:
        return ask(str(prompt), password=password, caller="getpass()" if password else "input()")

    kernel._input_request = input_request
    kernel._allow_stdin = True   # the notebook decides per prompt; its refusal names the rank
