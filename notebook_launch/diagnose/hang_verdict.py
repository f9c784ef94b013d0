"""Compare where the ranks of a hung run are and say, in one line, who the odd ones out are
(issue 20); then the detail, rank by rank. Pure: it takes the records ``diagnose.stacks``
collected and a function that names a file (a cell: ``Cell In[5]``), so it is tested without a
process.

The verdicts, from the most telling down:
- some ranks wait in a collective the others never reached: "ranks 0, 2, 3 wait in all_reduce #57
  (Cell In[5], line 12); rank 1 never reached it: it is in evaluate() at Cell In[5], line 30";
- ranks wait on the same group at the same number in different operations: "rank 0 waits in
  broadcast #9 while rank 1 waits in all_reduce #9: the ranks call collectives in a different order";
- ranks wait in init_process_group while others never called it: "... rank 3 never joined";
- every rank in the same collective: it is the collective itself (network, device) that hangs;
- no rank in a collective: where each one is, grouped by place.
"""
from __future__ import annotations

import linecache
import os
from dataclasses import dataclass, field
from typing import Callable, Sequence

Labeller = Callable[[str], "str | None"]   # a file name -> "Cell In[5]", or None for a plain file


@dataclass(frozen=True)
class Frame:
    filename: str
    lineno: int
    function: str


@dataclass(frozen=True)
class Collective:
    """The torch.distributed call a rank is in (or last made): from its whereabouts record."""
    op: str
    group: str            # "default group", "group of ranks [0, 1]"
    seq: int              # its number among the collectives this rank called on that group (0: not counted)
    tensors: str          # "(4,) float32"
    caller: Frame | None  # the user's line that called it


@dataclass
class ThreadStack:
    ident: int
    current: bool          # the thread that ran the signal handler
    frames: list[Frame]    # innermost first, as faulthandler writes them
    name: str = ""         # its threading name, where the rank's where-thread gave it


@dataclass
class RankWhereabouts:
    """What was learnt about one rank: ``inside`` is the collective it waits in, if any;
    ``last`` the last one it called when it is in none; ``threads`` its stacks;
    ``main_thread`` the ident of its main thread; ``note`` why something is missing."""
    rank: int
    inside: Collective | None = None
    last: Collective | None = None
    threads: list[ThreadStack] = field(default_factory=list)
    main_thread: int = 0
    note: str = ""
    raw_stacks: str = ""
    stalled_for: float | None = None   # seconds without a sign of progress (diagnose.stall), if watched
    beyond: list[str] = field(default_factory=list)   # what its Python stack cannot show (native_stacks)
    read_by: str = ""   # how its stacks were read: "thread" (its where-thread), "signal" (lock held), "" (not)

    def main_frames(self) -> list[Frame]:
        for thread in self.threads:
            if thread.ident == self.main_thread:
                return thread.frames
        return self.threads[0].frames if self.threads else []


def ranks_text(ranks: Sequence[int]) -> str:
    ranks = sorted(ranks)
    return (f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks)))


def _is_library(filename: str) -> bool:
    """A frame of Python itself, of an installed package or of notebook_launch: not the user's."""
    return ("site-packages" in filename or "dist-packages" in filename or "/lib/python" in filename
            or f"{os.sep}notebook_launch{os.sep}" in filename or filename.startswith("<frozen"))


def user_frame(frames: Sequence[Frame]) -> Frame | None:
    """The innermost frame of the user's code (a cell or their own file), else the innermost one
    that is not notebook_launch's (None when only ours are left: the verdict names no file of ours)."""
    theirs = [frame for frame in frames if not is_ours(frame.filename)]
    for frame in theirs:
        if not _is_library(frame.filename):
            return frame
    return theirs[0] if theirs else None


def place(frame: Frame | None, label: Labeller, with_source: bool = False) -> str:
    """'Cell In[5], line 30', or 'train.py:30' for a file."""
    if frame is None:
        return "an unknown place"
    cell = label(frame.filename) if frame.filename else None
    where = f"{cell}, line {frame.lineno}" if cell else f"{os.path.basename(frame.filename)}:{frame.lineno}"
    if with_source:
        source = linecache.getline(frame.filename, frame.lineno).strip()
        if source:
            where += f" ({source})"
    return where


def collective_text(c: Collective, label: Labeller) -> str:
    number = f" #{c.seq}" if c.seq else ""
    group = "" if c.group == "default group" else f" on the {c.group}"
    return f"{c.op}{number}{group} ({place(c.caller, label)})"


def location_text(rank: RankWhereabouts, label: Labeller) -> str:
    """'in evaluate() at Cell In[5], line 30 (time.sleep(3600))', or what the rank's note says
    when there is no stack (a verb phrase: 'ended: finished', 'not running')."""
    if rank.note and not any(thread.ident == rank.main_thread for thread in rank.threads):
        return rank.note   # no stack, or none of its main thread (a persistent rank between calls)
    frames = rank.main_frames()
    frame = user_frame(frames)
    if frame is None:
        return "in notebook_launch's own code, outside yours" if frames else "somewhere its stack did not show"
    return f"in {frame.function}() at {place(frame, label, with_source=True)}"


SIGNAL_READ = "read by a signal: no thread of {them} could answer (the interpreter lock was held by C code)"


def verdict(ranks: Sequence[RankWhereabouts], label: Labeller) -> str:
    """One line that names the odd ranks out and where they are, and, where some ranks could only
    be read by the signal (their interpreter lock held), which (the others answered themselves)."""
    text = _verdict(ranks, label)
    signalled = [r.rank for r in ranks if r.read_by == "signal"]
    if signalled:
        them = "it" if len(signalled) == 1 else "them"
        text += f" ({ranks_text(signalled)} {SIGNAL_READ.format(them=them)})"
    return text


def _verdict(ranks: Sequence[RankWhereabouts], label: Labeller) -> str:
    waiting = [r for r in ranks if r.inside is not None]
    others = [r for r in ranks if r.inside is None]
    if not waiting:
        if any(r.last is not None for r in ranks):   # they use torch.distributed: say they are not in it
            return "no rank waits in a torch.distributed collective: " + _grouped_places(others, label)
        return _grouped_places(others, label)
    # Group the waiting ranks by group and number (what must match across ranks).
    by_slot: dict[tuple[str, int], list[RankWhereabouts]] = {}
    for r in waiting:
        assert r.inside is not None
        by_slot.setdefault((r.inside.group, r.inside.seq), []).append(r)
    for (_group, seq), members in by_slot.items():
        ops = {r.inside.op for r in members if r.inside is not None}
        if len(ops) > 1 and seq:
            parts = []
            for op in sorted(ops, key=lambda op: min(r.rank for r in members if r.inside and r.inside.op == op)):
                who = [r.rank for r in members if r.inside is not None and r.inside.op == op]
                parts.append(f"{ranks_text(who)} {'waits' if len(who) == 1 else 'wait'} "
                             f"in {collective_text(_first(members, op), label)}")
            return " while ".join(parts) + ": the ranks call collectives in a different order"
    # The slot most ranks wait in is the one the others are missing.
    _slot, members = max(by_slot.items(), key=lambda item: (len(item[1]), -item[0][1]))
    head = members[0].inside
    assert head is not None
    verb = "waits" if len(members) == 1 else "wait"
    text = f"{ranks_text([r.rank for r in members])} {verb} in {collective_text(head, label)}"
    odd_waiting = [r for r in waiting if r not in members]
    if not others and not odd_waiting:
        everyone = "every rank waits" if len(ranks) > 1 else "the rank waits"
        return (f"{everyone} in {collective_text(head, label)}: all of them reached it, so the collective "
                f"itself does not complete (a network or device problem, or a rank of the group not in this run)")
    notes = []
    for r in odd_waiting:
        assert r.inside is not None
        notes.append(f"{ranks_text([r.rank])} waits in {collective_text(r.inside, label)} instead")
    if others:
        if head.op == "init_process_group":
            notes.append(f"{ranks_text([r.rank for r in others])} never joined: " + _each_place(others, label))
        else:
            notes.append(f"{ranks_text([r.rank for r in others])} never reached it: " + _each_place(others, label))
    return text + "; " + "; ".join(notes)


def _first(members: Sequence[RankWhereabouts], op: str) -> Collective:
    for r in members:
        if r.inside is not None and r.inside.op == op:
            return r.inside
    raise ValueError(op)


def _each_place(ranks: Sequence[RankWhereabouts], label: Labeller) -> str:
    if len(ranks) == 1:
        where = location_text(ranks[0], label)
        return f"it is {where}" if where.startswith("in ") else f"it {where}"
    return _grouped_places(ranks, label)


def _grouped_places(ranks: Sequence[RankWhereabouts], label: Labeller) -> str:
    """'ranks 0, 1 are in f() at ...; rank 2 is in g() at ...', ranks at one place together."""
    places: dict[str, list[int]] = {}
    for r in ranks:
        places.setdefault(location_text(r, label), []).append(r.rank)
    return "; ".join(f"{ranks_text(rs)} {'is' if len(rs) == 1 else 'are'} {where}" if where.startswith("in ")
                     else f"{ranks_text(rs)} {where}" for where, rs in places.items())


def notes_text(ranks: Sequence[RankWhereabouts]) -> str:
    """What the ranks' notes say, ranks with the same note together ('ranks 0, 1 had not started
    the launched function yet'), for an answer when no rank could say where it is."""
    return _grouped_places(ranks, lambda filename: None) if ranks else "there are no ranks to ask"


LAUNCHER_ENTRY = (f"{os.sep}notebook_launch{os.sep}rank{os.sep}runner.py", "call_and_report")
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # notebook_launch/
_PACKAGE = f"{os.sep}notebook_launch{os.sep}"
OUR_THREAD_NAME = "notebook_launch"   # the name (or its start) of every thread we start in a rank


def is_ours(filename: str) -> bool:
    """A file of notebook_launch, wherever the rank's copy is installed (a Ray node's too): a
    path through a folder named notebook_launch to one of this package's files."""
    at = filename.rfind(_PACKAGE)
    return at >= 0 and os.path.exists(os.path.join(_PACKAGE_DIR, filename[at + len(_PACKAGE):]))


def _is_python_itself(filename: str) -> bool:
    return filename.startswith("<frozen") or ("/lib/python" in filename and "site-packages" not in filename
                                              and "dist-packages" not in filename)


def is_our_thread(thread: ThreadStack) -> bool:
    """A thread notebook_launch started in the rank (the progress sender, the stack responder...):
    named so, or running only our code on Python's own (threading, queue, selectors)."""
    if getattr(thread, "name", "").startswith(OUR_THREAD_NAME):
        return True
    return any(is_ours(f.filename) for f in thread.frames) and all(
        is_ours(f.filename) or _is_python_itself(f.filename) for f in thread.frames)


def without_launcher_frames(frames: Sequence[Frame]) -> list[Frame]:
    """A rank's stack as the user wrote it: without the launcher's frames around their function
    (everything outside ``runner.call_and_report``) and our frames inside it (a persistent call's
    wrappers, the bookkeeping around a collective, ``progress()``)."""
    kept = list(frames)
    for index, frame in enumerate(kept):
        if frame.filename.endswith(LAUNCHER_ENTRY[0]) and frame.function == LAUNCHER_ENTRY[1]:
            kept = kept[:index]
            break
    return [frame for frame in kept if not is_ours(frame.filename)]


def hidden_text(count: int, what: str = "frame") -> str:
    """'(3 frames of notebook_launch hidden)': said wherever ours were left out (the logs keep them)."""
    return f"({count} {what}{'s' if count != 1 else ''} of notebook_launch hidden)"


def detail(ranks: Sequence[RankWhereabouts], label: Labeller, frames_per_thread: int = 12,
           whole: bool = False) -> str:
    """Rank by rank: the collective it is in (or last called), then each thread's stack, innermost
    last (as a Python traceback reads), cells named; at most ``frames_per_thread`` frames each.
    What the user sees leaves out the threads notebook_launch started and its frames, saying how
    many; ``whole`` (the logs) keeps every thread and frame."""
    lines: list[str] = []
    for r in sorted(ranks, key=lambda r: r.rank):
        lines.append(f"rank {r.rank}:")
        if r.note:
            lines.append(f"  {r.note}")
        if r.stalled_for is not None:
            lines.append(f"  stalled for {r.stalled_for:.0f} s: no output, progress or CPU time")
        if r.read_by == "signal":
            lines.append(f"  {SIGNAL_READ.format(them='it')}")
        if r.inside is not None:
            lines.append(f"  waits in {collective_text(r.inside, label)}"
                         + (f", tensors {r.inside.tensors}" if r.inside.tensors else ""))
        elif r.last is not None:
            lines.append(f"  in no collective; the last one it called: {collective_text(r.last, label)}")
        threads = [t for t in r.threads if whole or t.ident == r.main_thread or not is_our_thread(t)]
        for thread in sorted(threads, key=lambda t: t.ident != r.main_thread):   # the main thread first
            name = "main thread" if thread.ident == r.main_thread else f"thread 0x{thread.ident:x}"
            lines.append(f"  {name} (most recent call last):")
            shown = list(thread.frames) if whole else without_launcher_frames(thread.frames)
            frames = shown[:frames_per_thread]
            if len(shown) > len(frames):
                lines.append(f"    ... {len(shown) - len(frames)} outer frames left out")
            for frame in reversed(frames):
                lines.append(f"    {frame.function}() at {place(frame, label)}")
                source = linecache.getline(frame.filename, frame.lineno).strip()
                if source:
                    lines.append(f"      {source}")
            if len(thread.frames) > len(shown):   # after the stack, as a traceback's note reads
                lines.append(f"    {hidden_text(len(thread.frames) - len(shown))}")
        if len(threads) < len(r.threads):
            lines.append(f"  {hidden_text(len(r.threads) - len(threads), 'thread')}")
        lines.extend(f"  {line}" for line in r.beyond)
    return "\n".join(lines)
