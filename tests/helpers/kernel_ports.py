"""TCP ports for every Jupyter kernel the tests start, from a block of this process's own, below the
kernel's ephemeral port range.

Why: jupyter_client picks a kernel's five ports by binding port 0 and letting go, and the kernel
binds them a second or more later. On a busy machine another process took one in between (a
test's gloo store, a launch's rendezvous port, anything that binds port 0 or connects out: all of
them are handed ports of the ephemeral range, /proc/sys/net/ipv4/ip_local_port_range), and the
kernel died with "ZMQError: Address already in use", the test with "Kernel didn't respond in 60
seconds" (the Colab lane, once in three rehearsals). Unix sockets instead of ports were tried and
reverted: the Colab and Kaggle lanes' jupyter_client and ipykernel lost IOPub output over them.

So every test kernel listens on ports that nothing hands out by itself:

- the ports are in ``REGION`` (25000-29299), below the ephemeral range: bind(0) and outgoing
  connections never get them. Nothing in the project or its tests picks a fixed port there: torch's
  rendezvous defaults are 29400 and 29500 (``planning/net.py`` DEFAULT_PORT) and the tests' fixed
  ports 29400-29735, Ray's worker ports 10002-19999, a SLURM rank 0's store 15000 + the job id's
  last four digits (``engines/slurm/launcher.py``; those clusters run in network namespaces of their
  own anyway);
- each process draws from a ``BLOCK`` of its own, held with an abstract Unix socket named after
  the block: the lanes (a chroot has its own /tmp, not its own network) and the pytest-xdist workers
  never draw the same port, and the block is let go when its process ends;
- each port is checked free by binding it before it is given out (a kernel this process started
  earlier may still hold it).
"""
from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

REGION = range(25000, 29300)
BLOCK = 50                # ports per process: ten kernels' before they are drawn again
PORT_NAMES = ("shell_port", "iopub_port", "stdin_port", "hb_port", "control_port")
LOCK_PREFIX = "notebook-launch-test-kernel-ports"
RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def ephemeral_range() -> range:
    """The ports the kernel hands out for bind(0) and outgoing connections."""
    try:
        low, high = (int(part) for part in RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        return range(32768, 61000)   # Linux's default
    return range(low, high + 1)


def region() -> range:
    """``REGION``, checked to lie below this machine's ephemeral range."""
    low = ephemeral_range().start
    if low < REGION.stop:
        raise RuntimeError(
            f"the test kernels' ports ({REGION.start}-{REGION.stop - 1}) reach into this machine's ephemeral port "
            f"range ({RANGE_FILE}: from {low}), where another process can take one before the kernel binds it: "
            f"raise its low end to {REGION.stop} or more (sysctl net.ipv4.ip_local_port_range)")
    return REGION


class PortBlock:
    """This process's block of ports, held while the process lives."""

    def __init__(self, index: int, holder: socket.socket) -> None:
        self.index, self.holder = index, holder
        self.ports = range(region().start + index * BLOCK, region().start + (index + 1) * BLOCK)
        self.pid = os.getpid()
        self.next = 0

    def draw(self, host: str, count: int) -> list[int]:
        """``count`` ports of the block, each free now, in turn (a port drawn is drawn again only
        after the rest of the block was)."""
        found: list[int] = []
        for _ in range(len(self.ports)):
            port = self.ports[self.next % len(self.ports)]
            self.next += 1
            if port_is_free(host, port):
                found.append(port)
                if len(found) == count:
                    return found
        raise RuntimeError(f"fewer than {count} free ports in this test process's block "
                           f"{self.ports.start}-{self.ports.stop - 1}: {BLOCK // count} kernels at once at most")


_block: PortBlock | None = None


def block() -> PortBlock:
    """This process's block (a forked child claims one of its own)."""
    global _block
    if _block is None or _block.pid != os.getpid():
        _block = claim_block()
    return _block


def claim_block() -> PortBlock:
    """The first block no live process holds, starting from one the xdist worker and the pid spread out."""
    blocks = len(region()) // BLOCK
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    start = (int(worker) * 7 if worker.isdigit() else 0) + os.getpid()
    for step in range(blocks):
        index = (start + step) % blocks
        holder = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            holder.bind(f"\0{LOCK_PREFIX}-{REGION.start}-{BLOCK}-{index}")   # abstract: gone with the process
        except OSError:
            holder.close()
            continue
        return PortBlock(index, holder)
    raise RuntimeError(f"every one of the {blocks} blocks of test kernel ports is held by a live process")


def port_is_free(host: str, port: int) -> bool:
    """Nobody holds ``port`` on ``host`` now (no SO_REUSEADDR: a port in TIME_WAIT counts as taken)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def kernel_ports(host: str = "127.0.0.1", count: int = len(PORT_NAMES)) -> list[int]:
    """``count`` free ports of this process's block."""
    return block().draw(host, count)


def give_ports(km: Any) -> None:
    """Set a jupyter_client kernel manager's five ports from this process's block, where they are
    not set yet (a restart keeps the ports its kernel had: the kernel that let them go was this
    manager's)."""
    if km.transport != "tcp" or all(getattr(km, name) for name in PORT_NAMES):
        return
    for name, port in zip(PORT_NAMES, kernel_ports(km.ip or "127.0.0.1")):
        setattr(km, name, port)


def own_ports_manager(base: type) -> type:
    """``base`` (a jupyter_client KernelManager class) whose kernels get ``give_ports``'s ports. The
    hook is ``write_connection_file``: jupyter_client 7 and 8 (Colab's and Kaggle's, ours) both call it
    as the kernel starts, after the provisioner's own choice of ports, which ``cache_ports`` off skips
    (it would pick ports with bind(0))."""

    class OwnPorts(base):   # a class made from a class argument
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.cache_ports = False

        def write_connection_file(self, **kwargs: Any) -> None:
            give_ports(self)
            super().write_connection_file(**kwargs)

    OwnPorts.__name__ = OwnPorts.__qualname__ = f"OwnPorts{base.__name__}"
    return OwnPorts


def kernel_manager_class() -> type:
    """jupyter_client's KernelManager with ``give_ports``'s ports (one class for the process)."""
    global _manager_class
    if _manager_class is None:
        from jupyter_client.manager import KernelManager
        _manager_class = own_ports_manager(KernelManager)
    return _manager_class


_manager_class: type | None = None
