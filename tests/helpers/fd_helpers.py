"""Which of this process's fds a launch could have left open.

Earlier tests in the same pytest process leave Jupyter kernel clients whose zmq sockets
open and close eventfds from their own threads at any moment (a heartbeat channel
reconnecting, a context being reaped). notebook_launch never creates an eventfd, so fd
leak checks leave those out; every other fd (pipes, memfds, pidfds, epoll, files,
sockets) is counted."""
from __future__ import annotations

import os

FOREIGN = ("anon_inode:[eventfd]",)


def fd_links() -> dict[str, str]:
    """fd number -> what it points at, for the fds a launch could open."""
    links = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{name}")
        except OSError:   # the fd listing the folder itself
            continue
        if link not in FOREIGN:
            links[name] = link
    return links
