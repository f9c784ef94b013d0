"""The memfds a process holds, found through ``/proc/<pid>/fd``: how the notebook reaches a
rank's whereabouts record and stacks file (``rank.whereabouts``) and an XLA replica's record,
which the rank made and named, without any help from the rank. One reader for all of them."""
from __future__ import annotations

import os


def memfds(pid: int) -> dict[str, str]:
    """The memfds ``pid`` holds open: name -> its /proc path (the first fd of each name). Linux
    shows a memfd's link as "/memfd:NAME (deleted)"; the prefix slash and the suffix are not
    relied on. Empty when the process is gone or its fds cannot be read."""
    found: dict[str, str] = {}
    folder = f"/proc/{pid}/fd"
    try:
        names = os.listdir(folder)
    except OSError:
        return found
    for name in names:
        try:
            target = os.readlink(os.path.join(folder, name))
        except OSError:
            continue
        memfd = target.lstrip("/")
        if memfd.startswith("memfd:"):
            memfd = memfd[len("memfd:"):].removesuffix(" (deleted)")
            found.setdefault(memfd, os.path.join(folder, name))
    return found
