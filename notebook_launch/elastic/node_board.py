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
  hosting it does not take it away while others still read the outcome.
"""
from __future__ import annotations

import json
import logging
import time
from typing import Any, Callable

from ..protocol import Failure

PREFIX = "notebook_launch"
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
        try:
            count = self.store.add(f"{PREFIX}/left", 1)
            deadline = time.monotonic() + wait
            while hosting and count < self.num_nodes and time.monotonic() < deadline:
                time.sleep(0.05)
                count = self.store.add(f"{PREFIX}/left", 0)
        except Exception:  # the store is gone already: nobody is left to wait for
            log.debug("the rendezvous store is gone; not waiting for the other nodes", exc_info=True)
