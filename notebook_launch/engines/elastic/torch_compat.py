"""Every access to torch elastic's private fields, in one place.

torch offers no public accessor for these; each function names the field it
reads or writes. Checked on torch 2.9 and 2.13: ``SimpleElasticAgent`` keeps
``_remaining_restarts`` and ``_store`` (its worker group is public through
``get_worker_group()``), ``StaticTCPRendezvous`` keeps its TCPStore in ``_store``,
and ``rendezvous.utils._matches_machine_hostname`` decides whether c10d hosts the store.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent

# A handler of a torch we do not know: it has no ``_store`` to manage.
MISSING = object()


def remaining_restarts(agent: "SimpleElasticAgent") -> int:
    return int(agent._remaining_restarts)


def attempt_number(agent: "SimpleElasticAgent") -> int:
    """0 for the first attempt, then 1, 2, ... after each restart."""
    return agent.get_worker_group().spec.max_restarts - remaining_restarts(agent)


def drop_agent_store(agent: "SimpleElasticAgent") -> None:
    """Forget the agent's store, so nothing keeps the TCPStore server (and its port) alive."""
    agent._store = None
    agent.get_worker_group().store = None


def matches_machine_hostname(host: str) -> bool:
    """torch's own test of whether ``host`` names this machine (``_matches_machine_hostname``)."""
    from torch.distributed.elastic.rendezvous.utils import _matches_machine_hostname
    return bool(_matches_machine_hostname(host))


def static_store(handler: Any) -> Any:
    """The static rendezvous handler's TCPStore (None before the first round, MISSING if unknown)."""
    return getattr(handler, "_store", MISSING)


def set_static_store(handler: Any, store: Any) -> None:
    handler._store = store


def drop_static_store(handler: Any) -> None:
    """Let the static rendezvous's store server close once the run is over."""
    if hasattr(handler, "_store"):
        handler._store = None
