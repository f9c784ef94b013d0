"""Where ranks on other machines are (issue 20), the notebook's side; the rank's is
``rank.reports.remote_where``. Both engines ask through it: Ray's actors and SLURM's tasks answer on
the same connections (``channels.sockets``) in the same format (``channels.remote_where``), so
it lives with the rest of hang diagnosis rather than in either engine's package.

The supervisor asks each rank process for its ranks (``RankProcess.where``: ``ray.gang.RayRank``'s,
``engines.remote.handle.RemoteRank``'s). The ranks of one run share one ``WhereAsker``: the first rank asked
sends a request to every live rank at once and waits, ``WHERE_WAIT`` seconds at most for all of
them, for their answers; the others then take theirs from that round. So a hang is diagnosed in one
wait, however many ranks (or a lost node's) do not answer.

An answer becomes a ``RankWhereabouts`` as a local rank's record and dump would: the collective
parsed as ``diagnose.stacks`` parses a record, frames under their own file names (a cell's
function keeps its cell's file name through cloudpickle, so this kernel names it ``Cell In[N]``),
and the source lines the rank sent put in ``linecache`` for the files this machine cannot read.
"""
from __future__ import annotations

import linecache
import logging
import os
import select
import time
from typing import Any, Callable, Protocol, Sequence

from ..channels.pipes import read_ready
from ..channels.sockets import SocketPipes
from ..channels.remote_where import REPLY, REPLY_MAGIC, decode_body, request_frame
from ..rank.reports.whereabouts import SWITCHED_OFF_NOTE
from .hang_verdict import Frame, RankWhereabouts, ThreadStack
from .stacks import parse_collective

log = logging.getLogger("notebook_launch")
WHERE_WAIT = 5.0   # seconds one round waits for every rank's answer
REUSE = 2.0        # seconds a round's answers stay fresh for the ranks not yet given theirs
READ_SIZE = 1 << 20


class AskedRank(Protocol):
    """What the asker needs of a rank (``ray.gang.RayRank``, ``engines.remote.handle.RemoteRank``)."""
    local_rank: int
    pipes: SocketPipes

    def poll(self) -> Any: ...


class WhereAsker:
    """One gang's ranks, asked together (see the module)."""

    def __init__(self, ranks: Sequence[AskedRank], wait: float = WHERE_WAIT) -> None:
        self.ranks = list(ranks)
        self.wait = wait
        self.number = 0
        self.buffers: dict[int, bytes] = {}          # local rank -> bytes of answers read so far
        self.answers: dict[int, RankWhereabouts] = {}
        self.untaken: set[int] = set()               # ranks of the last round not given theirs yet
        self.done_at = 0.0

    def ask(self, rank: AskedRank, global_rank: Callable[[int], int]) -> dict[int, RankWhereabouts]:
        """``rank``'s whereabouts, by local rank (empty when it was not asked: its connection is
        closed), from this round, or from a new one asking every live rank."""
        local = rank.local_rank
        if local not in self.untaken or time.monotonic() - self.done_at > REUSE:
            self.round(global_rank)
        self.untaken.discard(local)
        where = self.answers.get(local)
        return {} if where is None else {local: where}

    def round(self, global_rank: Callable[[int], int]) -> None:
        """Ask every live rank at once; wait for their answers (``wait`` seconds for all)."""
        self.number += 1
        self.answers, self.untaken = {}, set()
        pending: dict[int, AskedRank] = {}
        for rank in self.ranks:
            pipes = rank.pipes
            if rank.poll() is not None or pipes.events_r in pipes.closed or pipes.answers_w in pipes.closed:
                continue
            try:
                _write(pipes.events_r, request_frame(self.number))
            except OSError as exc:
                self._answer(rank, global_rank, note=f"could not be asked where it is ({exc})")
                continue
            pending[pipes.answers_w] = rank
        deadline = time.monotonic() + self.wait
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            readable, _, _ = select.select(list(pending), [], [], left)
            for fd in readable:
                rank = pending[fd]
                chunk = read_ready(fd, READ_SIZE)
                if chunk is None:
                    continue
                if not chunk:
                    del pending[fd]
                    self._answer(rank, global_rank, note="ended before it said where it is")
                    continue
                body = self._take(rank.local_rank, chunk)
                if body is not None:
                    del pending[fd]
                    try:
                        self.answers[rank.local_rank] = decode_answer(body, global_rank(rank.local_rank))
                    except Exception as exc:   # why: a garbled answer is that rank's note; the others still count
                        log.debug("rank %d's where answer could not be read", rank.local_rank, exc_info=True)
                        self._answer(rank, global_rank, note=f"sent an answer that could not be read ({exc})")
                    self.untaken.add(rank.local_rank)
        for rank in pending.values():
            self._answer(rank, global_rank, note=f"did not say where it is within {self.wait:g} s (its node may "
                                                 f"be unreachable, or its process stopped)")
        self.done_at = time.monotonic()

    def _answer(self, rank: AskedRank, global_rank: Callable[[int], int], note: str) -> None:
        self.answers[rank.local_rank] = RankWhereabouts(global_rank(rank.local_rank), note=note)
        self.untaken.add(rank.local_rank)

    def _take(self, local: int, chunk: bytes) -> bytes | None:
        """The body of this round's answer once it is read whole; earlier rounds' late answers
        are dropped (their bytes may have arrived after their round gave up on them)."""
        data = self.buffers.get(local, b"") + chunk
        while len(data) >= REPLY.size:
            magic, number, size = REPLY.unpack_from(data)
            if magic != REPLY_MAGIC:   # never: the rank sends nothing else on this connection
                data = b""
                break
            if len(data) < REPLY.size + size:
                break
            body, data = data[REPLY.size:REPLY.size + size], data[REPLY.size + size:]
            if number == self.number % (1 << 32):
                self.buffers[local] = data
                return body
        self.buffers[local] = data
        return None


def _write(fd: int, data: bytes) -> None:
    view = memoryview(data)
    deadline = time.monotonic() + 1.0
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise
            select.select([], [fd], [], 0.1)


def decode_answer(body: bytes, rank: int) -> RankWhereabouts:
    """A rank's answer (``rank.reports.remote_where.snapshot``) as a ``RankWhereabouts``."""
    data = decode_body(body)
    where = RankWhereabouts(rank)
    if data.get("error"):
        where.note = f"could not say where it is ({data['error']})"
        return where
    record = data.get("record")
    if record is not None:
        collective = parse_collective(str(record["text"]), int(record["seq"]))
        if record["inside"]:
            where.inside = collective
        else:
            where.last = collective
    where.main_thread = int(data.get("main_thread") or 0)
    where.threads = [ThreadStack(int(ident), False, [Frame(str(f), int(n), str(fn)) for f, n, fn in frames])
                     for ident, frames in data.get("threads", [])]
    _remember_sources(data.get("sources", {}))
    if data.get("between_calls"):   # a persistent rank waiting for the next call: its main thread is ours
        where.threads = [t for t in where.threads if t.ident != where.main_thread]
        where.note = "waits for the next call"
    elif record is None:
        where.note = SWITCHED_OFF_NOTE if data.get("switched_off") else "had not started the launched function yet"
    return where


def _remember_sources(sources: dict[str, dict[str, str]]) -> None:
    """Put the lines a rank sent in ``linecache`` for the files this machine cannot read (a file
    of the rank's node only); a file readable here keeps its own lines."""
    for filename, lines in sources.items():
        if not lines:
            continue
        numbered = {int(k): v for k, v in lines.items()}
        if filename in _filled:   # lines an earlier answer sent: add these
            numbered = {**_filled[filename], **numbered}
        elif filename in linecache.cache or linecache.getline(filename, min(numbered)):
            continue
        _filled[filename] = numbered
        cache_lines(filename, numbered)


def cache_lines(name: str, numbered: dict[int, str]) -> None:
    """``linecache`` holds ``numbered`` (line number -> text) as the file ``name``, for a file of
    another machine: a rank's answer here, another elastic node's whereabouts (``node_board``).
    No mtime, so ``linecache.checkcache`` keeps it, as IPython's cells are kept."""
    text = [numbered.get(i, "") + "\n" for i in range(1, max(numbered) + 1)]
    linecache.cache[name] = (sum(map(len, text)), None, text, name)


_filled: dict[str, dict[int, str]] = {}   # files whose lines only the ranks' answers gave, as given
