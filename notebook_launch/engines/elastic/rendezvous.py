"""Accelerate-style rendezvous arguments -> torch.distributed.elastic's rendezvous.

The rendezvous itself is elastic's (``static`` = StaticTCPRendezvous, ``c10d`` =
DynamicRendezvousHandler with the C10d store backend), created through
elastic's registry exactly as ``torchrun`` / Accelerate create it. What this
module adds around it is what a notebook needs and elastic leaves out:

* one timeout for the whole rendezvous (``rdzv_timeout``), with a default of
  900 s like elastic's ``LaunchConfig``, applied to whichever backend runs;
* waits that an interrupt can stop: elastic's static rendezvous blocks inside
  C++ TCPStore calls (connect, wait-for-workers, multi_get) that ignore Ctrl-C
  until they time out. We create the static store without waiting, probe the
  endpoint from Python, and check that every node arrived by polling;
* an error that names the nodes that never arrived;
* the address of this node for c10d (the route towards the endpoint, not the
  hostname, which often resolves to loopback), and whether this node hosts
  the c10d store when torch's hostname heuristic cannot tell.
"""
from __future__ import annotations

import datetime
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ...planning import net as network
from ...planning.net import free_port
from . import torch_compat

if TYPE_CHECKING:
    from ...planning.options import LaunchOptions

log = logging.getLogger("notebook_launch")
ARRIVAL_POLL = 0.1
ARRIVED_KEY = "notebook_launch/arrived/{round}/{rank}"


class RendezvousFailed(RuntimeError):
    """The nodes did not all meet: timeout, unreachable endpoint, or a store error."""


@dataclass(frozen=True)
class RendezvousSettings:
    backend: str              # "static", "c10d", "etcd", "etcd-v2"
    endpoint: str             # host:port of the rendezvous store
    run_id: str
    node_rank: int
    num_nodes: int
    timeout: float            # seconds for every node to arrive
    config: dict = field(default_factory=dict)   # rendezvous-specific options, as rdzv_conf
    local_addr: str | None = None
    is_host: bool | None = None                   # c10d: this node hosts the store
    may_move_port: bool = False                   # one node on the default port: another is fine

    @property
    def host(self) -> str:
        return self.endpoint.rsplit(":", 1)[0].strip("[]")

    @property
    def port(self) -> int:
        return int(self.endpoint.rsplit(":", 1)[1])


def settings_for(options: "LaunchOptions", port: int) -> RendezvousSettings:
    """Complete the launch's rendezvous arguments the way Accelerate reads them. ``options`` were
    checked and their timeout resolved once (``options.launch_options``); ``port``: the one this
    launch settled on (``launcher.plan_launch``)."""
    rdzv_backend, rdzv_endpoint, timeout = options.rdzv_backend, options.rdzv_endpoint, options.rendezvous_timeout
    master_addr, node_rank, num_nodes = options.master_addr, options.node_rank, options.num_nodes
    may_move_port = options.port_is_default
    config = dict(options.rdzv_conf or {})
    endpoint = rdzv_endpoint.strip() or f"{master_addr}:{port}"
    if rdzv_backend in ("static", "c10d") and ":" not in endpoint:
        endpoint = f"{endpoint}:{port}"
    settings: dict[str, Any] = dict(
        backend=rdzv_backend, endpoint=endpoint, run_id=options.rdzv_id, node_rank=node_rank, num_nodes=num_nodes,
        timeout=timeout, may_move_port=may_move_port and num_nodes == 1 and not rdzv_endpoint.strip())
    if rdzv_backend == "static":
        config["rank"] = node_rank
        config["timeout"] = int(max(1, round(timeout)))
    elif rdzv_backend == "c10d":
        config.setdefault("join_timeout", int(max(1, round(timeout))))
        host = endpoint.rsplit(":", 1)[0].strip("[]")
        is_host = config.get("is_host")
        if is_host is None and network.is_local_address(host) and not _torch_thinks_host(host):
            config["is_host"] = is_host = True    # torch's hostname match misses this interface
        if is_host is None:
            is_host = _torch_thinks_host(host)
        settings["is_host"] = bool(is_host) if not isinstance(is_host, str) else is_host.lower() in (
            "1", "true", "yes", "y", "on")
        if not network.is_loopback(host):
            settings["local_addr"] = network.source_address_toward(host)
    return RendezvousSettings(config=config, **settings)


def _torch_thinks_host(host: str) -> bool:
    try:
        return torch_compat.matches_machine_hostname(host)
    except Exception:   # why: torch's helper is private and may be missing: only loopback then counts as this host
        log.debug("torch's hostname match is unavailable; only loopback counts as this host", exc_info=True)
        return network.is_loopback(host)


def rendezvous_parameters(settings: RendezvousSettings) -> Any:
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    return RendezvousParameters(
        backend=settings.backend, endpoint=settings.endpoint, run_id=settings.run_id,
        min_nodes=settings.num_nodes, max_nodes=settings.num_nodes,
        local_addr=settings.local_addr, **settings.config)


def create_handler(settings: RendezvousSettings) -> "NotebookRendezvous":
    """Elastic's handler for ``settings.backend``, wrapped so every wait is interruptible and bounded."""
    from torch.distributed.elastic.rendezvous import registry
    deadline = time.monotonic() + settings.timeout
    if settings.backend == "c10d" and not settings.is_host:
        _wait_for_endpoint(settings, deadline)
    try:
        inner = registry.get_rendezvous_handler(rendezvous_parameters(settings))
    except Exception as exc:
        raise RendezvousFailed(
            f"could not create the {settings.backend} rendezvous at {settings.endpoint}: "
            f"{type(exc).__name__}: {exc}") from exc
    return NotebookRendezvous(inner, settings)


def _wait_for_endpoint(settings: RendezvousSettings, deadline: float) -> None:
    if not network.wait_until_listening(settings.host, settings.port, deadline):
        raise RendezvousFailed(
            f"no node opened the rendezvous at {settings.endpoint} within {settings.timeout:g} s "
            f"(rdzv_timeout). Start the call on the node that hosts it (node 0: master_addr / "
            f"rdzv_endpoint must be its address), or check that this node can reach it.")


_HandlerBase: type
try:
    from torch.distributed.elastic.rendezvous import RendezvousHandler as _HandlerBase
except ImportError:  # torch without distributed support: the launcher refuses earlier
    _HandlerBase = object


class NotebookRendezvous(_HandlerBase):
    """Delegates to elastic's handler; makes the static backend's waits
    interruptible and reports which nodes never arrived."""

    def __init__(self, inner: Any, settings: RendezvousSettings) -> None:
        self.inner = inner
        self.settings = settings
        self.round = -1
        self.world_size = settings.num_nodes

    # --- the part we add -----------------------------------------------------
    def next_rendezvous(self) -> Any:
        self.round += 1
        deadline = time.monotonic() + self.settings.timeout
        if self.settings.backend == "static":
            self._open_static_store(deadline)
        try:
            info = self.inner.next_rendezvous()
        except Exception as exc:
            if type(exc).__name__ in ("RendezvousTimeoutError", "DistStoreError", "TimeoutError"):
                raise RendezvousFailed(self._timeout_message()) from exc
            raise
        self.world_size = info.world_size
        if self.settings.backend == "static":
            self._wait_for_all(info.store, info.rank, info.world_size, deadline)
        return info

    def _open_static_store(self, deadline: float) -> None:
        inner = self.inner
        if torch_compat.static_store(inner) is not None:
            return  # created in an earlier round, or a torch whose handler we do not know
        from torch.distributed import TCPStore
        timeout = datetime.timedelta(seconds=max(1.0, self.settings.timeout))
        if inner.rank == 0:
            for tries_left in (2, 1, 0):
                try:
                    torch_compat.set_static_store(inner, TCPStore(
                        inner.master_addr, inner.master_port, inner.world_size, True, timeout,
                        multi_tenant=True, wait_for_workers=False))
                    return
                except Exception as exc:
                    if not (self.settings.may_move_port and tries_left):
                        raise RendezvousFailed(
                            f"node 0 could not open the rendezvous store on port {inner.master_port} "
                            f"({type(exc).__name__}: {exc}). Pass a free use_port, the same on every "
                            f"node.") from exc
                    # one node, default port: taken since the launcher checked it; nobody else needs it
                    inner.master_port = free_port()
        _wait_for_endpoint(self.settings, deadline)
        torch_compat.set_static_store(
            inner, TCPStore(inner.master_addr, inner.master_port, inner.world_size, False, timeout))

    def _wait_for_all(self, store: Any, rank: int, world_size: int, deadline: float) -> None:
        store.set(ARRIVED_KEY.format(round=self.round, rank=rank), "1")
        keys = [ARRIVED_KEY.format(round=self.round, rank=r) for r in range(world_size)]
        while True:
            missing = [r for r, key in enumerate(keys) if not store.check([key])]
            if not missing:
                return
            if time.monotonic() >= deadline:
                raise RendezvousFailed(self._timeout_message(missing))
            time.sleep(ARRIVAL_POLL)

    def _timeout_message(self, missing: list[int] | None = None) -> str:
        s = self.settings
        who = (f"node{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} never arrived"
               if missing else f"not all {s.num_nodes} nodes arrived")
        return (f"the {s.backend} rendezvous at {s.endpoint} timed out after {s.timeout:g} s "
                f"(rdzv_timeout): {who}. Run the same cell on every node with num_nodes={s.num_nodes} "
                f"and a different node_rank each, or pass a larger rdzv_timeout.")

    # --- plain delegation ------------------------------------------------------
    def get_backend(self) -> str:
        return self.inner.get_backend()

    @property
    def use_agent_store(self) -> bool:
        return self.inner.use_agent_store

    def is_closed(self) -> bool:
        return self.inner.is_closed()

    def set_closed(self) -> None:
        return self.inner.set_closed()

    def num_nodes_waiting(self) -> int:
        return self.inner.num_nodes_waiting()

    def get_run_id(self) -> str:
        return self.inner.get_run_id()

    def shutdown(self) -> bool:
        try:
            return self.inner.shutdown()
        finally:
            torch_compat.drop_static_store(self.inner)
