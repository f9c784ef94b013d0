"""A rank other than 0 waits for rank 0's rendezvous store to listen before torch connects to it.

torch's TCPStore client that finds nobody listening on MASTER_PORT yet tries again only after a
fixed pause (about half a second in torch 2.13, measured): when every rank starts at the same
moment, as the ranks a SLURM node agent forks do (``slurm.node_agent``), a rank that calls
``init_process_group`` a moment before rank 0 has bound its store loses that pause, in about
half the launches (benchmarks/RESULTS-slurm.md). So, for an ``env://`` rendezvous, such a rank
first tries a plain connection every ``WAIT_STEP`` seconds, for ``WAIT_LIMIT`` seconds at most,
and then hands over to torch's own rendezvous, whose retries and timeout stay as they were (for
a rank 0 that comes later, or never). A connection that is accepted and closed at once is
nothing to the store (it reads no request). Installed by SLURM's rank (``slurm.task``) only.
"""
from __future__ import annotations

import logging
import os
import socket
import sys
import time
from typing import Any

log = logging.getLogger("notebook_launch")
WAIT_STEP = 0.005   # seconds between two tries: a refused connection costs microseconds
WAIT_LIMIT = 5.0    # seconds of trying before torch's own retries take over
_PATCHED = "_notebook_launch_waits_for_store"


def wait_for_store_before_rendezvous() -> None:
    """Wrap c10d's ``rendezvous`` (looked up at call time by init_process_group), if torch.distributed
    is imported already (a rank that imports it later connects as torch does)."""
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    rendezvous = getattr(c10d, "rendezvous", None)
    if rendezvous is None or getattr(rendezvous, _PATCHED, False):
        return

    def rendezvous_once_the_store_listens(url: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(url, str) and url.startswith("env://") and os.environ.get("RANK") not in (None, "0"):
            wait_for_listener(os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", ""))
        return rendezvous(url, *args, **kwargs)

    setattr(rendezvous_once_the_store_listens, _PATCHED, True)
    c10d.rendezvous = rendezvous_once_the_store_listens  # type: ignore[union-attr]


def wait_for_listener(host: str, port_text: str, limit: float = WAIT_LIMIT) -> bool:
    """True once ``host:port`` accepts a connection; False after ``limit`` seconds of refusals, or
    at once for an address that cannot be tried (torch then says what is wrong with it)."""
    try:
        address = (host, int(port_text))
    except ValueError:
        return False
    deadline = time.monotonic() + limit
    while True:
        try:
            socket.create_connection(address, timeout=limit).close()
            return True
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                return False
            time.sleep(WAIT_STEP)
        except OSError:
            log.debug("cannot reach the rendezvous store at %s:%s", host, port_text, exc_info=True)
            return False
