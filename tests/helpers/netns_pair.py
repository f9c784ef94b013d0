"""Two hosts on one machine: two network namespaces joined by a veth pair, each with only
loopback and its end of the link (used by tests/multinode and tests/raycluster).

Needs root and iproute2 (`scripts/system-packages.sh` installs it); ``unavailable_reason``
says why not, so the tests skip with it."""
from __future__ import annotations

import os
import secrets
import shutil
import subprocess


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True, timeout=30)


def unavailable_reason() -> str | None:
    if shutil.which("ip") is None:
        return "needs the `ip` command (apt-get install iproute2; scripts/system-packages.sh does it)"
    if os.geteuid() != 0:
        return "needs root to create network namespaces (ip netns add)"
    probe = f"nl-probe-{secrets.token_hex(3)}"
    result = ip("netns", "add", probe, check=False)
    if result.returncode != 0:
        return f"`ip netns add` failed here ({result.stderr.strip()}); namespaces need CAP_SYS_ADMIN"
    ip("netns", "del", probe, check=False)
    return None


def pair_names(prefix: str) -> tuple[list[str], list[str], list[str]]:
    """Fresh namespace names, veth names and 10.x.y.1/.2 addresses for one pair."""
    tag = secrets.token_hex(3)
    octets = (200 + secrets.randbelow(50), secrets.randbelow(250))
    return ([f"{prefix}-a-{tag}", f"{prefix}-b-{tag}"], [f"{prefix}a{tag}", f"{prefix}b{tag}"],
            [f"10.{octets[0]}.{octets[1]}.{i}" for i in (1, 2)])


def create_pair(namespaces: list[str], links: list[str], addresses: list[str]) -> None:
    for ns in namespaces:
        ip("netns", "add", ns)
    ip("link", "add", links[0], "type", "veth", "peer", "name", links[1])
    for ns, link, addr in zip(namespaces, links, addresses):
        ip("link", "set", link, "netns", ns)
        ip("-n", ns, "addr", "add", f"{addr}/24", "dev", link)
        ip("-n", ns, "link", "set", link, "up")
        ip("-n", ns, "link", "set", "lo", "up")


def delete_pair(namespaces: list[str]) -> None:
    for ns in namespaces:
        ip("netns", "del", ns, check=False)   # also removes the veth pair
