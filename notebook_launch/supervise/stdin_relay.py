"""The notebook's side of a rank's stdin: put each rank's prompt to the frontend, send the answer back.

A rank that reads stdin (input(), getpass(), pdb; see rank/stdin_relay.py) sends an
INPUT_REQUEST event and waits for an INPUT_REPLY on the same socket. The supervisor hands
the request to ``StdinRelay``, which asks the frontend one prompt at a time (first come,
first served), tagged with the rank: in a Jupyter kernel an ``input_request`` on the
kernel's stdin channel (what ipykernel's own ``input()`` sends, when the frontend allows
stdin), in a terminal the prompt on stdout and a line from the terminal. Nothing here
blocks: the supervisor polls once per step, so the other ranks' output, the timeout, the
Stop button and Ctrl-C keep working while a prompt waits. Where the frontend cannot
answer, the rank gets an error at once that names the rank and says what to do.
"""
from __future__ import annotations

import logging
import os
import select
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from ..wire import protocol
from ..errors.ipython_shell import running_kernel
from ..notebook.notebook_streams import ERR, OUT

log = logging.getLogger("notebook_launch")
Reply = Callable[[protocol.InputReplyPayload], None]
NO_STDIN_ADVICE = (
    "Pass the value as an argument of the launched function instead, or run where input is possible "
    "(JupyterLab, Jupyter Notebook, VS Code, a script in a terminal); PYTHONBREAKPOINT=0 skips breakpoint().")


class Frontend(Protocol):
    """Where prompts go: ``start`` shows one, ``poll`` returns its answer once there is one."""
    in_terminal: bool

    def start(self, prompt: str, password: bool) -> None: ...

    def poll(self) -> protocol.InputReplyPayload | None: ...

    def cancel(self) -> None: ...


class KernelFrontend:
    """Prompts through the Jupyter kernel's stdin channel (input_request / input_reply), without
    blocking: ipykernel's own raw_input would hold the supervisor until the answer comes."""
    in_terminal = False

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel
        self.parent = kernel.get_parent("shell")     # the cell's execute_request: the box shows there
        self.ident = kernel._parent_ident["shell"]

    def start(self, prompt: str, password: bool) -> None:
        import zmq
        for stream in (OUT, ERR):  # the rank's lines shown so far come before the box
            stream.flush()
        socket = self.kernel.stdin_socket
        while True:  # like ipykernel: drop stale replies (an answer to a prompt given up on)
            try:
                socket.recv_multipart(zmq.NOBLOCK)
            except zmq.ZMQError:
                break
        self.kernel.session.send(socket, "input_request", {"prompt": prompt, "password": password},
                                 self.parent, ident=self.ident)

    def poll(self) -> protocol.InputReplyPayload | None:
        import zmq
        try:
            _, reply = self.kernel.session.recv(self.kernel.stdin_socket, mode=zmq.NOBLOCK)
        except Exception:   # why: a reply the frontend garbled is dropped; the prompt waits for the next
            log.debug("bad input_reply from the frontend", exc_info=True)
            return None
        if reply is None:
            return None
        value = str(reply.get("content", {}).get("value", ""))
        return {"eof": "end of input (Ctrl-D)"} if value == "\x04" else {"line": value}

    def cancel(self) -> None:
        """The Jupyter protocol cannot withdraw a prompt; a late answer is dropped by the next start."""


class TerminalFrontend:
    """Prompts on the terminal the notebook process runs in; reads the answer without blocking."""
    in_terminal = True

    def __init__(self, fd: int = 0) -> None:
        self.fd = fd
        self.buffer = b""
        self.saved_mode: list[Any] | None = None

    def start(self, prompt: str, password: bool) -> None:
        self.buffer = b""
        if password:
            self._echo_off()   # before the prompt shows: a fast typist's first keys stay hidden
        OUT.write(prompt)
        OUT.flush()

    def poll(self) -> protocol.InputReplyPayload | None:
        while select.select([self.fd], [], [], 0)[0]:
            data = os.read(self.fd, 4096)
            if not data:
                self._restore()
                return {"eof": "end of input (Ctrl-D)"}
            self.buffer += data
            if b"\n" in self.buffer:
                line = self.buffer.partition(b"\n")[0]
                self._restore()
                return {"line": line.decode(errors="replace").rstrip("\r")}
        return None

    def cancel(self) -> None:
        """The rank ended or the run stops: end the prompt's line, give the terminal its echo back."""
        if not self._restore():
            OUT.write("\n")
        OUT.flush()

    def _echo_off(self) -> None:
        import termios
        try:
            mode = termios.tcgetattr(self.fd)
            self.saved_mode = list(mode)
            mode[3] &= ~termios.ECHO
            termios.tcsetattr(self.fd, termios.TCSADRAIN, mode)
        except termios.error:
            log.debug("could not turn terminal echo off for a password prompt", exc_info=True)

    def _restore(self) -> bool:
        if self.saved_mode is None:
            return False
        import termios
        try:
            termios.tcsetattr(self.fd, termios.TCSADRAIN, self.saved_mode)
        except termios.error:
            log.debug("could not restore the terminal mode", exc_info=True)
        self.saved_mode = None
        OUT.write("\n")  # the Enter was not echoed
        return True


def detect_frontend() -> tuple[Frontend | None, str]:
    """The frontend that can answer a rank's prompt now, or None and why not."""
    kernel = _running_kernel()
    if kernel is not None:
        if getattr(kernel, "_allow_stdin", False) and getattr(kernel, "stdin_socket", None) is not None:
            try:
                return KernelFrontend(kernel), ""
            except Exception:   # why: an ipykernel without it: the prompt is refused, with that reason
                log.debug("this ipykernel does not offer what a prompt needs", exc_info=True)
                return None, "this ipykernel version cannot be asked for input by notebook_launch"
        return None, ("this Jupyter frontend does not accept input (nbclient and papermill run cells "
                      "without stdin; a jupyter_client caller passes allow_stdin=True)")
    try:
        if os.isatty(0):
            return TerminalFrontend(0), ""
    except OSError:
        log.debug("fd 0 of the notebook process is not usable", exc_info=True)
    return None, "the notebook process has no terminal to ask (its stdin is not a tty)"


def _running_kernel() -> Any:
    return running_kernel()


def reply_on(fd: int, still_open: Callable[[], bool]) -> Reply:
    """How an answer reaches a rank: an INPUT_REPLY frame on the notebook's end of its answers
    pipe (non-blocking; a frame this small is written whole), unless that fd was closed meanwhile
    (its number may belong to someone else by now)."""
    def reply(answer: protocol.InputReplyPayload) -> None:
        if not still_open():
            return
        try:
            protocol.EventWriter(fd, lock_frames=False).send(protocol.EventKind.INPUT_REPLY, answer)
        except OSError:   # the rank died while it waited
            log.debug("could not answer a rank's prompt on fd %d", fd, exc_info=True)
    return reply


class StdinRelay:
    """One prompt at a time, first come first served, for every rank of a run.

    ``on_terminal_prompt(True)`` is called before a prompt shows in a terminal and
    ``(False)`` after it is answered, so a live panel can stop redrawing over it."""

    def __init__(self, rank_label: Callable[[int], str],
                 on_terminal_prompt: Callable[[bool], None] = lambda showing: None,
                 detect: Callable[[], tuple[Frontend | None, str]] = detect_frontend) -> None:
        self.rank_label = rank_label      # local rank -> "rank 3"
        self.on_terminal_prompt = on_terminal_prompt
        self._detect = detect
        self._frontend: Frontend | None = None
        self._why_not: str | None = None
        self.waiting: deque[tuple[int, protocol.InputRequestPayload, Reply]] = deque()
        self.asking: tuple[int, protocol.InputRequestPayload, Reply] | None = None
        self.closed_reason: str | None = None

    def request(self, local: int, payload: protocol.InputRequestPayload, reply: Reply) -> None:
        """Rank ``local`` asked for a line; ``reply(answer)`` sends the answer to it."""
        caller = payload.get("caller", "input()")
        if self.closed_reason is not None:
            reply({"unavailable": f"{self.rank_label(local)}: {caller} was refused: {self.closed_reason}"})
            return
        if self._frontend_now() is None:
            reply({"unavailable": f"{self.rank_label(local)}: {caller} needs an answer from the notebook, "
                                  f"but {self._why_not}. {NO_STDIN_ADVICE}"})
            return
        self.waiting.append((local, payload, reply))
        self._next()

    def poll(self) -> None:
        """Once per supervisor step: deliver an answer that arrived, then show the next prompt."""
        if self.asking is None or self._frontend is None:
            return
        answer = self._frontend.poll()
        if answer is not None:
            reply = self.asking[2]
            self._end_prompt()
            reply(answer)
            self._next()

    def waits_for_answer(self, local: int) -> bool:
        """Rank ``local`` waits for an answer to its input() (asked or queued)."""
        return (self.asking is not None and self.asking[0] == local) or any(
            item[0] == local for item in self.waiting)

    def forget(self, local: int) -> None:
        """Rank ``local`` ended: drop its prompts."""
        self.waiting = deque(item for item in self.waiting if item[0] != local)
        if self.asking is not None and self.asking[0] == local:
            self._cancel()
            self._next()

    def close(self, reason: str) -> None:
        """The run is stopping: refuse what waits, and every later request."""
        self.closed_reason = reason
        if self.asking is not None:
            self.waiting.appendleft(self.asking)
            self._cancel()
        while self.waiting:
            local, payload, reply = self.waiting.popleft()
            reply({"unavailable": f"{self.rank_label(local)}: {payload.get('caller', 'input()')} was "
                                  f"refused: {reason}"})

    def _frontend_now(self) -> Frontend | None:
        if self._frontend is None and self._why_not is None:
            self._frontend, self._why_not = self._detect()
        return self._frontend

    def _next(self) -> None:
        if self.asking is not None or not self.waiting or self._frontend is None:
            return
        self.asking = self.waiting.popleft()
        local, payload, _ = self.asking
        if self._frontend.in_terminal:
            self.on_terminal_prompt(True)
        self._frontend.start(f"[{self.rank_label(local)}] {payload.get('prompt', '')}",
                             bool(payload.get("password")))

    def _cancel(self) -> None:
        if self._frontend is not None:
            self._frontend.cancel()
        self._end_prompt()

    def _end_prompt(self) -> None:
        self.asking = None
        if self._frontend is not None and self._frontend.in_terminal:
            self.on_terminal_prompt(False)
