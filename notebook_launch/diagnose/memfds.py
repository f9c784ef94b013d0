"""The memfds a process holds, found through ``/proc/<pid>/fd``: how the notebook reaches a
rank's whereabouts record and stacks file (``rank.reports.whereabouts``) and an XLA replica's record,
which the rank made and named, without any help from the rank. One reader for all of them.

A name alone does not say whose a memfd is: a process holds every fd the process that forked
it held, so a rank can hold another process's record and stacks file of the same names beside
its own (seen in CI: ranks forked by a test process that had held one read back the forker's
record and could not say where they were). A rank's own record names its pid and its stacks fd.
"""
from __future__ import annotations

import os

from ..channels.where_request import ANSWERS_NAME
from ..rank.reports.whereabouts import HEADER, MAGIC, RECORD_NAME, STACKS_NAME


def memfds(pid: int) -> dict[str, list[str]]:
    """The memfds ``pid`` holds open: name -> their /proc paths, in fd order. Linux shows a
    memfd's link as "/memfd:NAME (deleted)"; the prefix slash and the suffix are not relied on.
    Empty when the process is gone or its fds cannot be read."""
    found: dict[str, list[str]] = {}
    folder = f"/proc/{pid}/fd"
    try:
        names = sorted(os.listdir(folder), key=lambda fd: int(fd) if fd.isdigit() else -1)
    except OSError:
        return found
    for name in names:
        memfd = memfd_name(os.path.join(folder, name))
        if memfd is not None:
            found.setdefault(memfd, []).append(os.path.join(folder, name))
    return found


def memfd_name(path: str) -> str | None:
    """The name of the memfd ``path`` (a /proc/<pid>/fd/<n> link) points to; None if it is not one."""
    try:
        target = os.readlink(path)
    except OSError:
        return None
    memfd = target.lstrip("/")
    if not memfd.startswith("memfd:"):
        return None
    return memfd[len("memfd:"):].removesuffix(" (deleted)")


def record_header(path: str) -> tuple[int, int, int] | None:
    """(pid, stacks fd number, answers fd number) from the header of the whereabouts record at
    ``path``; None when it is not one (yet: the magic is written last)."""
    try:
        with open(path, "rb") as f:
            head = f.read(HEADER.size)
    except OSError:
        return None
    if len(head) < HEADER.size:
        return None
    magic, owner, _thread, _signum, stacks_fd, answers_fd = HEADER.unpack_from(head, 0)
    return (owner, stacks_fd, answers_fd) if magic == MAGIC else None


def rank_files(pid: int) -> dict[str, str]:
    """The /proc paths of rank ``pid``'s own whereabouts record, stacks file and where-thread's
    answers, by name: the record whose header names ``pid`` and the fds it names. Where the
    rank has no record of its own, the first it holds (its header then names another process,
    which the caller reports) and no stacks file."""
    found = memfds(pid)
    records = found.get(RECORD_NAME, [])
    for path in records:
        header = record_header(path)
        if header is not None and header[0] == pid:
            files = {RECORD_NAME: path}
            stacks = f"/proc/{pid}/fd/{header[1]}"
            if header[1] > 0 and memfd_name(stacks) == STACKS_NAME:
                files[STACKS_NAME] = stacks
            answers = f"/proc/{pid}/fd/{header[2]}"
            if header[2] > 0 and memfd_name(answers) == ANSWERS_NAME:
                files[ANSWERS_NAME] = answers
            return files
    return {RECORD_NAME: records[0]} if records else {}

