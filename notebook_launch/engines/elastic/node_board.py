"""What the nodes of a run tell each other, through the rendezvous store.

Elastic stops a node's own workers when one fails, but the other nodes only
find out when their ranks hit a broken collective (seconds later, or never if
they are not communicating), and then they report that secondary "Connection
closed by peer" error instead of the real one. So each attempt has a small
board in the store elastic's rendezvous already shares between the agents:

* ``failure/<attempt>``: the first failure, written with compare_set so the
  first writer wins and every node reads the same record (node, rank,
  headline, traceback);
* ``done/<attempt>``: a counter of nodes whose ranks all returned, so a node
  only reports success once every node has (elastic's own exit barrier would
  otherwise wait 300 s for a node that failed);
* ``left``: a counter of nodes that are finished with the store, so the node
  hosting it does not take it away while others still read the outcome;
* ``where-asked/<attempt>`` and ``where/<attempt>/<request>/<node>``: where every rank is, for the
  verdict on a hang across nodes (issue 20). The node that diagnoses a hang (its timeout) counts a
  request up and posts its own ranks' whereabouts; every other node's agent sees the request on
  its next step and posts its own (``answer_where``); the asking node waits a few seconds for them
  and gives one verdict over every rank ("rank 3 never reached all_reduce #57", rank 3 being on
  node 1). Frames travel with their source lines and cells with their labels
  (``encode_whereabouts``), since the asking node has neither the other node's files nor its cells.
"""
from __future__ import annotations

import json
import linecache
import logging
import time
from typing import Any, Callable, Sequence

from ...errors.best_effort import best_effort
from ...wire.protocol import Failure
from ...diagnose.hang_verdict import Collective, Frame, Labeller, RankWhereabouts, ThreadStack
from ...diagnose.remote_where import cache_lines

PREFIX = "notebook_launch"
WHERE_WAIT = 5.0   # seconds the node that diagnoses a hang waits for the other nodes' whereabouts
log = logging.getLogger("notebook_launch")


class BoardUnreachable(RuntimeError):
    """The store went away: the node hosting it ended or the network failed."""


class NodeBoard:
    def __init__(self, store: Any, *, node: int, num_nodes: int, attempt: int, endpoint: str = "") -> None:
        self.store = store
        self.node = node
        self.num_nodes = num_nodes
        self.attempt = attempt
        self.endpoint = endpoint
        self._marked_done = False
        self._answered = 0   # the last where-request this node answered

    def _key(self, what: str) -> str:
        return f"{PREFIX}/{what}/{self.attempt}"

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as exc:
            where = f" at {self.endpoint}" if self.endpoint else ""
            raise BoardUnreachable(
                f"lost contact with the rendezvous store{where} ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''}); the node hosting it (node 0) "
                f"probably ended or was interrupted") from exc

    # --- failures -----------------------------------------------------------
    def publish_failure(self, record: Failure) -> Failure:
        """Post ``record`` unless another node posted first; return the winning record."""
        data = json.dumps(record.to_record()).encode()
        winner = self._call(self.store.compare_set, self._key("failure"), b"", data)
        try:
            return Failure.from_record(json.loads(winner))
        except (TypeError, ValueError):
            log.debug("the failure board returned no record; ours stands")
            return record

    def failure(self) -> Failure | None:
        key = self._key("failure")
        if not self._call(self.store.check, [key]):
            return None
        return Failure.from_record(json.loads(self._call(self.store.get, key)))

    def wait_for_failure(self, seconds: float, poll: float = 0.1) -> Failure | None:
        deadline = time.monotonic() + seconds
        while True:
            record = self.failure()
            if record is not None or time.monotonic() >= deadline:
                return record
            time.sleep(poll)

    # --- success ------------------------------------------------------------
    def mark_done(self) -> None:
        if not self._marked_done:
            self._call(self.store.add, self._key("done"), 1)
            self._marked_done = True

    def all_done(self) -> bool:
        return self._call(self.store.add, self._key("done"), 0) >= self.num_nodes

    # --- leaving ------------------------------------------------------------
    def leave(self, *, hosting: bool, wait: float) -> None:
        """Count this node out; the node hosting the store waits (at most ``wait``
        seconds) for the others, so none of them loses the store mid-read."""
        # the store is gone already: nobody is left to wait for
        with best_effort("the rendezvous store is gone; not waiting for the other nodes"):
            count = self.store.add(f"{PREFIX}/left", 1)
            deadline = time.monotonic() + wait
            while hosting and count < self.num_nodes and time.monotonic() < deadline:
                time.sleep(0.05)
                count = self.store.add(f"{PREFIX}/left", 0)

    # --- where every rank is (a hang across nodes) --------------------------------------
    def _where_key(self, request: int, node: int) -> str:
        return f"{PREFIX}/where/{self.attempt}/{request}/{node}"

    def ask_where(self, own: Sequence[RankWhereabouts], label: Labeller,
                  wait: float = WHERE_WAIT) -> list[RankWhereabouts]:
        """Every node's ranks' whereabouts: ``own`` (this node's, first and in their order) then
        what the other nodes post within ``wait`` seconds, by rank (a node that does not answer
        is left out, its ranks not being known here: the verdict is over the ranks that answered)."""
        request = self._call(self.store.add, self._key("where-asked"), 1)
        text = encode_whereabouts(own, label)
        for earlier in range(self._answered + 1, request + 1):   # ours, and any another node made before
            self._call(self.store.set, self._where_key(earlier, self.node), text)
        self._answered = request
        found = {self.node: list(own)}
        deadline = time.monotonic() + wait
        while len(found) < self.num_nodes and time.monotonic() < deadline:
            time.sleep(0.1)
            for node in range(self.num_nodes):
                key = self._where_key(request, node)
                if node not in found and self._call(self.store.check, [key]):
                    found[node] = decode_whereabouts(self._call(self.store.get, key), node)
            self._answer_newer(own, label)   # another node asking at the same time: answer it too
        missing = [node for node in range(self.num_nodes) if node not in found]
        if missing:
            log.debug("nodes %s did not say where their ranks are within %g s", missing, wait)
        others = sorted((r for node, ranks in found.items() if node != self.node for r in ranks), key=lambda r: r.rank)
        return list(own) + others   # this node's first, in its order: the supervisor pairs them with its ranks

    def _answer_newer(self, own: Sequence[RankWhereabouts], label: Labeller) -> None:
        latest = self._call(self.store.add, self._key("where-asked"), 0)
        for request in range(self._answered + 1, latest + 1):
            self._call(self.store.set, self._where_key(request, self.node), encode_whereabouts(own, label))
        self._answered = max(self._answered, latest)

    def answer_where(self, collect: Callable[[], Sequence[RankWhereabouts]], label: Labeller) -> None:
        """Called on every step of a node's agent: if a node asked where the ranks are since this
        node last answered, post where this node's ranks are (``collect()``, its supervisor's)."""
        latest = self._call(self.store.add, self._key("where-asked"), 0)
        if latest <= self._answered:
            return
        text = encode_whereabouts(collect(), label)
        for request in range(self._answered + 1, latest + 1):
            self._call(self.store.set, self._where_key(request, self.node), text)
        self._answered = latest


# --- whereabouts over the wire -------------------------------------------------------------
def _frame_out(frame: Frame | None, label: Labeller, sources: dict[str, dict[str, str]]) -> Any:
    if frame is None:
        return None
    name = label(frame.filename) if frame.filename else None
    text = linecache.getline(frame.filename, frame.lineno).rstrip("\n") if frame.filename else ""
    if text:
        sources.setdefault(frame.filename, {})[str(frame.lineno)] = text
    return [frame.filename, frame.lineno, frame.function, name]


def encode_whereabouts(ranks: Sequence[RankWhereabouts], label: Labeller) -> bytes:
    """``ranks`` as JSON: each frame with the cell label this node gives its file (or null), and
    the source lines the frames point at (the other node has neither)."""
    sources: dict[str, dict[str, str]] = {}

    def collective(c: Collective | None) -> Any:
        return None if c is None else [c.op, c.group, c.seq, c.tensors, _frame_out(c.caller, label, sources)]

    out = []
    for r in ranks:
        out.append({"rank": r.rank, "inside": collective(r.inside), "last": collective(r.last),
                    "main_thread": r.main_thread, "note": r.note, "stalled_for": r.stalled_for,
                    "beyond": list(getattr(r, "beyond", [])), "read_by": r.read_by,
                    "threads": [[t.ident, t.current, [_frame_out(f, label, sources) for f in t.frames]]
                                for t in r.threads]})
    return json.dumps({"ranks": out, "sources": sources}).encode()


def remote_filename(node: int, filename: str, label: str | None) -> str:
    """The name a frame of ``node`` gets here: its cell label, said to be that node's ("node 1
    Cell In[5]": no cell of this kernel has that name), or its own file name."""
    return f"node {node} {label}" if label else filename


def decode_whereabouts(data: bytes | str, node: int) -> list[RankWhereabouts]:
    """``encode_whereabouts``'s ranks back, their cells renamed (``remote_filename``) and their
    source lines put in ``linecache`` where this machine cannot read the file; each rank's note
    says which node it runs on."""
    payload = json.loads(data)
    renamed: dict[str, str] = {}

    def frame(item: Any) -> Frame | None:
        if item is None:
            return None
        filename, lineno, function, label = item
        name = remote_filename(node, filename, label)
        renamed[name] = filename
        return Frame(name, int(lineno), function)

    def collective(item: Any) -> Collective | None:
        return None if item is None else Collective(item[0], item[1], int(item[2]), item[3], frame(item[4]))

    ranks = []
    for r in payload["ranks"]:
        where = RankWhereabouts(int(r["rank"]), inside=collective(r["inside"]), last=collective(r["last"]),
                                main_thread=int(r["main_thread"]), stalled_for=r.get("stalled_for"),
                                read_by=str(r.get("read_by", "")))   # "signal": its interpreter lock was held
        where.threads = [ThreadStack(int(ident), bool(current), [f for f in map(frame, frames) if f is not None])
                         for ident, current, frames in r["threads"]]
        where.note = f"on node {node}" + (f": {r['note']}" if r.get("note") else "")
        if r.get("beyond") and hasattr(where, "beyond"):   # native frames, stuck children (native_stacks)
            where.beyond = list(r["beyond"])
        ranks.append(where)
    for name, original in renamed.items():
        lines = payload["sources"].get(original)
        if lines and name not in linecache.cache and not linecache.getline(name, int(next(iter(lines)))):
            cache_lines(name, {int(k): v for k, v in lines.items()})
    return ranks
