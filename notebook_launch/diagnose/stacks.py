"""Ask every live rank where it is, while it may be blocked in C (issue 20): read its
collective record (``rank.reports.whereabouts``: no help from the rank needed) and ask its where-thread
for every thread's Python stack (``where_thread``: no signal; it answers even while the main thread
waits in gloo, a lock or ``time.sleep``). ``hang_verdict`` makes sense of the result.
"""
from __future__ import annotations

import logging
import mmap
from dataclasses import dataclass
from typing import Any, Sequence

from ..rank.reports.whereabouts import (FIELD_SEP, GEN_OFFSET, HEADER, MAGIC, RECORD_NAME, RECORD_SIZE, STACKS_NAME,
                                STATE, SWITCHED_OFF_NOTE, TEXT_OFFSET, switched_off)
from ..channels.where_request import ANSWERS_NAME
from . import hang_verdict, where_thread
from .memfds import rank_files
from .hang_verdict import Collective, Frame, RankWhereabouts

DUMP_WAIT = 2.0       # seconds to wait for the ranks' answers (milliseconds, unless a rank's lock is held)
log = logging.getLogger("notebook_launch")



def read_record(path: str) -> tuple[int, int, int, Collective | None, bool] | None:
    """(pid, main thread ident, dump signal, collective, inside) from a rank's record, or None
    when there is none (yet). Retries while the rank is writing (an odd or changed generation)."""
    try:
        with open(path, "rb") as f:
            mapped = mmap.mmap(f.fileno(), RECORD_SIZE, access=mmap.ACCESS_READ)
    except (OSError, ValueError):
        return None
    with mapped:
        magic, pid, main_thread, signum, _, _ = HEADER.unpack_from(mapped, 0)
        if magic != MAGIC:
            return None
        for _ in range(1000):
            gen, inside, size, seq = STATE.unpack_from(mapped, GEN_OFFSET)
            text = bytes(mapped[TEXT_OFFSET:TEXT_OFFSET + size])
            again = STATE.unpack_from(mapped, GEN_OFFSET)
            if gen == again[0] and gen % 2 == 0:
                return pid, main_thread, signum, parse_collective(text.decode("utf-8", "replace"), seq), \
                    bool(again[1])
        return pid, main_thread, signum, None, False


def parse_collective(text: str, seq: int) -> Collective | None:
    fields = text.split(FIELD_SEP)
    if len(fields) != 6:
        return None
    op, group, tensors, filename, lineno, function = fields
    caller = Frame(filename, int(lineno), function) if filename else None
    return Collective(op, group, seq, tensors, caller)


def collect(ranks: Sequence[tuple[int, int | None]], wait: float = DUMP_WAIT) -> list[RankWhereabouts]:
    """Where each of ``ranks`` ((global rank, pid or None when it is not running)) is now. A
    rank's ``note`` (a past-tense phrase, it follows "rank 1") says what could not be learnt;
    its ``read_by`` how its stacks were read (``where_thread``: its where-thread, or the signal)."""
    found: list[RankWhereabouts] = []
    asking: list[tuple[RankWhereabouts, where_thread.Asked]] = []
    for rank, pid in ranks:
        where = RankWhereabouts(rank)
        found.append(where)
        if pid is None:
            where.note = "was not running"
            continue
        files = rank_files(pid)
        try:
            record = read_record(files[RECORD_NAME]) if RECORD_NAME in files else None
        except Exception as exc:   # why: a record we cannot make sense of: this rank says nothing, the others do
            where.note = f"could not be read ({type(exc).__name__}: {exc})"
            continue
        if record is None and switched_off():
            where.note = SWITCHED_OFF_NOTE   # it may be in all_reduce: no record says it has not started
            continue
        if record is None or record[0] != pid or STACKS_NAME not in files:
            where.note = ("had not started the launched function yet" if record is None or record[0] == pid
                          else "kept the record of the process that forked it")
            continue
        _, where.main_thread, signum, collective, inside = record
        if inside:
            where.inside = collective
        else:
            where.last = collective
        asking.append((where, where_thread.Asked(pid, files.get(ANSWERS_NAME), files[STACKS_NAME], signum)))
    where_thread.ask_all([asked for _, asked in asking], wait)
    for where, asked in asking:
        where.read_by = asked.how
        if asked.note:
            where.note = asked.note
            continue
        where.raw_stacks = asked.text
        try:
            where.threads = where_thread.threads(asked)
        except Exception as exc:   # why: one rank's unreadable stack is said in its note; the others are still read
            where.note = f"gave a stack that could not be read ({type(exc).__name__}: {exc})"
    return found


def add_beyond_python(found: Sequence[RankWhereabouts], asked: Sequence[tuple[int, int | None]],
                      label: hang_verdict.Labeller, native: bool = True) -> None:
    """Add to each rank what its Python stack cannot show (``native_stacks.beyond_python``: its
    stuck children's stacks, and with ``native`` and py-spy installed, its native frames)."""
    try:
        from . import native_stacks
    except ImportError:   # optional
        return
    more = native_stacks.beyond_python(asked, label, native=native)
    for where in found:
        where.beyond.extend(more.get(where.rank, []))


def where_they_are(found: Sequence[RankWhereabouts], label: hang_verdict.Labeller) -> tuple[str | None, str]:
    """The verdict and the detail for ``collect``'s answer; (None, "") when no rank could say
    anything (none has a record: not our ranks, or none got to its function)."""
    if not any(r.threads or r.inside or r.last for r in found):
        return None, ""
    return hang_verdict.verdict(found, label), hang_verdict.detail(found, label)


@dataclass(frozen=True)
class WhereReport:
    """Where the ranks are (``Ranks.stacks()``): ``verdict`` (one line) and ``detail`` (each rank's
    collective and threads). Shows as its text in a notebook and with ``print``."""
    verdict: str
    detail: str

    def __str__(self) -> str:
        return f"{self.verdict}\n\n{self.detail}" if self.detail else self.verdict

    __repr__ = __str__

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:   # IPython shows the text as it is
        printer.text(str(self))
