"""This node's network: free ports, and the facts multi-node launches need.

Two pitfalls motivate this module. Gloo picks the interface whose address the
hostname resolves to; on many machines (Debian's 127.0.1.1, containers,
network namespaces) that is loopback, so other nodes are told to connect to
127.0.0.1 and the first collective times out. And c10d's rendezvous decides
whether this node hosts the store by matching the endpoint against the
hostname's addresses, which misses secondary interfaces. Both are answered
here from the kernel's own view: which local address routes to a host, which
interface carries it, and whether an address is ours.
"""
from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct
import logging
import os
import tempfile
import time

from ..wire.fork_locks import ForkRenewedLock

SIOCGIFADDR = 0x8915
log = logging.getLogger("notebook_launch")
DEFAULT_PORT = 29500


def ipv4_of(host: str) -> str | None:
    """The IPv4 address ``host`` names, or None when it does not resolve to one."""
    try:
        return str(socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0])
    except (OSError, IndexError):
        log.debug("%s does not resolve to an IPv4 address", host, exc_info=True)
        return None


def addresses_of(host: str) -> list[tuple[int, str]]:
    """Every (family, address) ``host`` resolves to, IPv4 and IPv6; empty when it resolves to none.
    An ASCII name goes as bytes: getaddrinfo encodes a str with the 'idna' codec, whose import
    (stringprep, unicodedata) was a few ms of a process's first launch; it leaves ASCII as it is."""
    name: str | bytes = host.encode("ascii") if host.isascii() else host
    try:
        infos = socket.getaddrinfo(name, None, socket.AF_UNSPEC, socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        log.debug("%s does not resolve", host, exc_info=True)
        return []
    return list(dict.fromkeys((family, str(sockaddr[0])) for family, _, _, _, sockaddr in infos))


def store_address_problem(host: str, *, hosts_store: bool, timeout: float = 3.0) -> str | None:
    """Why the ranks could not reach a rendezvous store at ``host``, or None.

    Every rank, node 0's included, connects to MASTER_ADDR; with a name that does not resolve, or an
    address this node cannot reach, torch waits in C++ until its own timeout (minutes), so the cell
    only hangs. Checked before any rank starts. On the node that hosts the store (``hosts_store``) the
    address must lead back to this node: one of its own addresses passes at once (a bind, no packet
    sent); any other (a NAT's public address) passes only if a connection to a port we listen on
    comes back to us within ``timeout`` seconds. Other nodes only resolve it: node 0 may not be up yet."""
    found = addresses_of(host)
    if not found:
        return f"master_addr={host!r} does not resolve to an address (checked with getaddrinfo on this machine)"
    if not hosts_store:
        return None
    if any(_can_bind(family, addr) for family, addr in found):
        return None
    if any(_reaches_self(family, addr, timeout) for family, addr in found):
        return None
    shown = ", ".join(addr for _, addr in found)
    return (f"master_addr={host!r} ({shown}) is not an address of this machine, and a connection to it did not "
            f"come back here within {timeout:g} s; this node (node_rank=0) hosts the rendezvous store, which "
            f"every rank reaches at master_addr")


def _can_bind(family: int, addr: str) -> bool:
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((addr, 0))
        except OSError:
            return False
    return True


def _reaches_self(family: int, addr: str, timeout: float) -> bool:
    """Whether a TCP connection to ``addr`` reaches a socket listening on every address of this node."""
    with socket.socket(family, socket.SOCK_STREAM) as server:
        try:
            server.bind(("::" if family == socket.AF_INET6 else "", 0))
            server.listen(1)
            port = server.getsockname()[1]
            with socket.create_connection((addr, port), timeout=timeout):
                return True
        except OSError:
            log.debug("no connection from this node back to itself through %s", addr, exc_info=True)
            return False


def is_loopback(host: str) -> bool:
    addr = ipv4_of(host) if host not in ("::1",) else "::1"
    try:
        return addr is not None and ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False


def is_local_address(host: str) -> bool:
    """True when ``host`` is an address of this node (binding to it works only then)."""
    addr = ipv4_of(host)
    if addr is None:
        return False
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((addr, 0))
        except OSError:
            return False
    return True


def source_address_toward(host: str) -> str | None:
    """The local address this node uses to reach ``host`` (no packet is sent)."""
    addr = ipv4_of(host)
    if addr is None:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect((addr, 9))
            return str(sock.getsockname()[0])
        except OSError:
            log.debug("no route from this node toward %s", addr, exc_info=True)
            return None


def interface_with_address(addr: str) -> str | None:
    """The name of the interface that carries the IPv4 address ``addr``."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(sock.fileno(), SIOCGIFADDR,
                                     struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
            if socket.inet_ntoa(packed[20:24]) == addr:
                return name
    return None


def interface_toward(host: str) -> str | None:
    """The interface other nodes can reach this node on, judged by the route to ``host``."""
    source = source_address_toward(host)
    return interface_with_address(source) if source else None


def wait_until_listening(host: str, port: int, deadline: float, poll: float = 0.25) -> bool:
    """Poll until something accepts TCP connections on host:port, or ``deadline``
    (time.monotonic) passes. Pure Python, so Ctrl-C / a Jupyter interrupt stops
    it at once, unlike a TCPStore client that waits inside C++."""
    while True:
        try:
            with socket.create_connection((host, port), timeout=min(2.0, max(0.1, poll * 4))):
                return True
        except OSError:
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll)


def port_is_free(port: int, host: str = "") -> bool:
    """True when a TCP server (as c10d's TCPStore binds it, with SO_REUSEADDR) could listen on ``port``."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


class PortReservation:
    """A claim on a TCP port among this machine's launches, held until :meth:`release`.

    Between a launch finding its port free and rank 0's store listening on it there are tens of
    milliseconds in which a second launch (another thread of the notebook, another notebook) finds
    the same port free, and one of them then fails with EADDRINUSE. Each claim is an exclusive
    ``flock`` on a file named after the port in one folder shared by the machine's users: the kernel
    drops it when the holder closes it or dies, so a crashed notebook never leaves a port claimed."""

    FOLDER = os.path.join(tempfile.gettempdir(), "notebook_launch-ports")

    def __init__(self, port: int, fd: int) -> None:
        self.port = port
        self._fd = fd

    @classmethod
    def path(cls, port: int) -> str:
        """The file whose flock is the claim on ``port``."""
        return os.path.join(cls.FOLDER, f"{port}.lock")

    @classmethod
    def claim(cls, port: int) -> "PortReservation | None":
        """The claim, or None when another launch on this machine holds this port."""
        try:
            os.makedirs(cls.FOLDER, mode=0o1777, exist_ok=True)
            fd = os.open(cls.path(port), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        except OSError:   # an unwritable temp folder: launch as before, unclaimed
            log.debug("cannot claim port %d; launching without a claim", port, exc_info=True)
            return cls(port, -1)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return None
        return cls(port, fd)

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


_held: dict[str, list[PortReservation]] = {}
_held_lock = ForkRenewedLock()


def hold_claim(owner: str, claim: PortReservation) -> None:
    """Keep ``claim`` until ``release_claims(owner)`` (a run id: the run's end releases it)."""
    with _held_lock:
        _held.setdefault(owner, []).append(claim)


def release_claims(owner: str) -> None:
    with _held_lock:
        claims = _held.pop(owner, [])
    for claim in claims:
        claim.release()


def claim_free_port(port: int, host: str = "") -> PortReservation | None:
    """A claim on ``port`` if it is free and no other launch here holds it, else None."""
    claim = PortReservation.claim(port)
    if claim is not None and not port_is_free(port, host):
        claim.release()
        return None
    return claim


def claim_any_free_port(host: str = "", tries: int = 20) -> PortReservation:
    """A claim on a port the kernel says is free and no other launch here holds."""
    for _ in range(tries):
        claim = claim_free_port(free_port(host), host)
        if claim is not None:
            return claim
    raise OSError(f"no free TCP port found in {tries} tries")


def free_port(host: str = "") -> int:
    """A port the kernel says is free now (bind to 0)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
