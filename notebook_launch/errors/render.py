"""How our errors show themselves in IPython: the failing rank's cells, not our frames.

IPython asks an exception for ``_render_traceback_()`` (a list of lines) before
formatting its Python traceback; ``NotebookLaunchError``'s method answers with
``render_traceback``. Only IPython calls it: a script still prints the usual
traceback and message.

An interrupt that ended a launch or a call (``errors.KeyboardInterrupt``) shows the frames of
the user's cells and files it passed, as IPython would, without ours and IPython's own.

A LaunchError shows its headline, the rank's traceback with every notebook-cell
frame named as IPython names it (``Cell In[2], line 6``) with the cell's lines
around it, frames of notebook_launch left out, then the other ranks' fates and the
log folder. GuardError and LaunchArgumentError show their message, no frames:
the message says what to do. ``%tb`` shows the same; ``%debug`` still opens the
notebook-side frames (the traceback object is untouched).
"""
from __future__ import annotations

import linecache
import logging
import os
import re
from types import TracebackType
from typing import Any

from .ipython_shell import running_shell

log = logging.getLogger("notebook_launch")

BOLD_RED, GREEN, CYAN, DIM, RESET = "\x1b[1;31m", "\x1b[32m", "\x1b[36m", "\x1b[2m", "\x1b[0m"
CONTEXT_BEFORE, CONTEXT_AFTER = 2, 1    # cell lines shown around the failing line
_FRAME = re.compile(r'^  File "(?P<file>[^"]+)", line (?P<line>\d+)(?:, in (?P<name>.+))?$')
# notebook_launch/, whose frames a rank's traceback leaves out (this file is in notebook_launch/errors/)
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_TAIL_STARTS = ("Other ranks:", "Ranks:", "Ranks on this node")


def render_traceback(error: BaseException) -> list[str]:
    """What IPython shows for ``error``: a launch failure with its rank's traceback rendered,
    any other error as its message."""
    try:
        if getattr(error, "remote_traceback", None) is not None or hasattr(error, "log_dir"):
            return render_launch_error(error)
        return render_message(error)
    except Exception:   # IPython falls back to its own traceback when this raises; say why
        log.debug("rendering %s failed", type(error).__name__, exc_info=True)
        raise


def render_interrupt(interrupt: BaseException) -> list[str]:
    """A KeyboardInterrupt out of a launch or a call: its message (as a LaunchError shows its
    headline first), then the frames of the user's code it passed (the cell that launched, the
    user's functions around the call), each as IPython shows a frame, then how many of ours were
    left out. IPython's own frames (the cell's runner, a magic's dispatch) are left out uncounted,
    as IPython itself leaves out its runner."""
    shown: list[str] = []
    hidden = 0
    for filename, lineno, name in _frames(interrupt.__traceback__):
        if is_ours(filename):
            hidden += 1
        elif not _is_ipython(filename):
            shown += render_frame(filename, lineno, None if name == "<module>" else name,
                                  _source_line(filename, lineno))
    message = str(interrupt)
    out = [f"{BOLD_RED}KeyboardInterrupt{RESET}" + (f": {message}" if message else "")]
    if shown:
        out += ["", f"{CYAN}Traceback{RESET} (most recent call last):"] + shown
    if hidden:
        out.append(hidden_note(hidden))
    return out


def _frames(traceback: TracebackType | None) -> list[tuple[str, int, str]]:
    frames = []
    while traceback is not None:
        code = traceback.tb_frame.f_code
        frames.append((code.co_filename, traceback.tb_lineno, code.co_name))
        traceback = traceback.tb_next
    return frames


def _source_line(filename: str, lineno: int) -> list[str]:
    line = linecache.getline(filename, lineno).strip()
    return [f"    {line}"] if line else []


def is_ours(filename: str) -> bool:
    """A file of notebook_launch (the package this module is part of)."""
    return os.path.abspath(filename).startswith(_PACKAGE_DIR)


def _is_ipython(filename: str) -> bool:
    """A file of IPython or ipykernel: the machinery that ran the cell, not the user's code."""
    parts = os.path.abspath(filename).split(os.sep)
    return "IPython" in parts or "ipykernel" in parts


def hidden_note(count: int, what: str = "frame") -> str:
    """'(3 frames of notebook_launch hidden)': said wherever ours were left out (the logs keep them)."""
    return f"{DIM}({count} {what}{'s' if count != 1 else ''} of notebook_launch hidden){RESET}"


def render_message(error: BaseException) -> list[str]:
    """GuardError / LaunchArgumentError: what went wrong and what to do, no frames."""
    lines = str(error).splitlines() or [""]
    return [f"{BOLD_RED}{type(error).__name__}{RESET}: {lines[0]}"] + lines[1:]


def render_launch_error(error: Any) -> list[str]:
    """The message as it is, with the rank's traceback block replaced by its rendering."""
    message = str(error)
    lines = message.splitlines() or [""]
    out = [f"{BOLD_RED}{type(error).__name__}{RESET}: {BOLD_RED}{lines[0]}{RESET}"]
    remote = (getattr(error, "remote_traceback", None) or "").rstrip()
    if not remote:
        return out + lines[1:]
    at = message.find(remote)
    if at >= 0:   # headline, "Traceback from rank N ...:", the traceback, what follows it
        before = message[:at].splitlines()[1:]
        after = message[at + len(remote):].splitlines()
        if after and not after[0].strip():
            after = after[1:]
    else:         # the message quotes the traceback shortened: keep the text around it we know
        rank = getattr(error, "rank", None)
        before, after = ["", f"Traceback from rank {rank}:"], [""] + _tail(lines)
    if before and before[-1].startswith("Traceback from"):
        before[-1] = f"{CYAN}{before[-1].rstrip(':')}{RESET} (most recent call last):"
    return out + before + render_remote_traceback(remote) + after


def _tail(lines: list[str]) -> list[str]:
    """The message's part after the traceback: the other ranks' fates and the log folder."""
    for index in range(len(lines) - 1, -1, -1):
        if lines[index].startswith(_TAIL_STARTS):
            return lines[index:]
    return [line for line in lines if line.startswith("Logs")]


def render_remote_traceback(text: str) -> list[str]:
    """A rank's formatted traceback with cell frames named as IPython names them and our
    own frames left out. Lines that are not frames (chaining notes, the exception) stay."""
    out: list[str] = []
    lines = text.rstrip("\n").splitlines()
    index = 0
    hidden = 0
    while index < len(lines):
        line = lines[index]
        match = _FRAME.match(line)
        if line.startswith("Traceback (most recent call last)"):
            index += 1
            continue
        if match is None:
            out.append(f"{BOLD_RED}{line}{RESET}" if _is_exception_line(line) else line)
            index += 1
            continue
        body = []
        index += 1
        while index < len(lines) and lines[index].startswith("    "):
            body.append(lines[index])
            index += 1
        filename, lineno, name = match["file"], int(match["line"]), match["name"]
        if is_ours(filename):
            hidden += 1
            continue
        out += render_frame(filename, lineno, name, body)
    if hidden:
        out.append(hidden_note(hidden))
    return out


def _is_exception_line(line: str) -> bool:
    return bool(line) and not line.startswith(" ") and ":" in line and not line.startswith(
        ("During handling", "The above exception"))


def render_frame(filename: str, lineno: int, name: str | None, body: list[str]) -> list[str]:
    """One frame: ``Cell In[2], line 6, in train`` and the cell's lines, or the file's as given."""
    where = f", in {name}" if name else ""
    cell = cell_label(filename)
    if cell is None:
        return [f"{GREEN}File {filename}:{lineno}{RESET}{where}"] + body
    source = linecache.getlines(filename)
    if not source:
        return [f"{GREEN}{cell}, line {lineno}{RESET}{where}"] + body
    first = max(1, lineno - CONTEXT_BEFORE)
    last = min(len(source), lineno + CONTEXT_AFTER)
    shown = [f"{GREEN}{cell}, line {lineno}{RESET}{where}"]
    for number in range(first, last + 1):
        text = source[number - 1].rstrip("\n")
        if number == lineno:
            shown.append(f"{GREEN}---> {number:<3}{RESET}{text}")
        else:
            shown.append(f"     {number:<3}{text}")
    return shown


def cell_label(filename: str) -> str | None:
    """'Cell In[2]' for a file IPython compiled a cell to (this kernel's cells), else None.

    IPython >= 8 names cells itself (``compile.format_code_name``). IPython 7 (Colab's and
    Kaggle's 7.34) keeps no map from a cell's file name to its number, and ipykernel 6 names a
    cell after a hash of its text (``/tmp/ipykernel_<pid>/<hash>.py``), so we find the number:
    a cell body our magics compiled was remembered (``remember_cell``); any other cell is the
    newest history entry whose text is the file's text (IPython keeps both, the file's in
    ``linecache``; matching text rather than hashes is exact for any compiler)."""
    shell = running_shell()
    compiler = getattr(shell, "compile", None)
    if compiler is None:
        return None
    format_code_name = getattr(compiler, "format_code_name", None)
    if format_code_name is not None:   # IPython >= 8: its own names are the truth
        named = format_code_name(filename)
        return None if named is None else f"{named[0]} {named[1]}"
    number = getattr(compiler, "_filename_map", {}).get(filename)
    if number is None:
        number = _remembered.get(filename)
    if number is None:
        number = _number_from_history(shell, filename)
    return None if number is None else f"Cell In[{number}]"


_remembered: dict[str, int] = {}   # file name -> In[n] of cell bodies our magics compiled (IPython 7)


def remember_cell(filename: str, number: int) -> None:
    """A cell body that a magic (``%%launch``, ``%%ranks``) compiled under ``filename``: its
    text is not the history's (that holds the magic line too), so say its number here."""
    _remembered[filename] = number


def _number_from_history(shell: Any, filename: str) -> int | None:
    """The newest In[n] whose transformed text is the text IPython cached for ``filename``.
    Only files IPython itself cached (``linecache._ipython_cache``) are cells."""
    entry = getattr(linecache, "_ipython_cache", {}).get(filename)
    history = getattr(getattr(shell, "history_manager", None), "input_hist_parsed", None)
    if entry is None or not history:
        return None
    lines = _without_trailing_blanks([line[:-1] for line in entry[2]])   # cached: each line + "\n"
    for number in range(len(history) - 1, 0, -1):
        if _without_trailing_blanks(history[number].splitlines()) == lines:   # history: stripped of "\n"
            return number
    return None


def _without_trailing_blanks(lines: list[str]) -> list[str]:
    """``lines`` (a list of the caller's) without its empty lines at the end."""
    while lines and not lines[-1]:
        lines.pop()
    return lines
