"""faulthandler's all-thread dump, read back: the text a rank (or a child it forked) writes on
``DUMP_SIGNAL`` into its stacks file, or its where-thread's answer in the same format
(``rank.reports.where_thread``), turned into one ``ThreadStack`` per thread. Its own module
because both the ranks' stacks (``stacks``) and their forked children's (``native_stacks``) are
read with it, and neither should import the other for it."""
from __future__ import annotations

import re

from .hang_verdict import Frame, ThreadStack

_THREAD = re.compile(r"^(Current thread|Thread) 0x([0-9a-fA-F]+)(?: \[(.*)\])? \(")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')


def parse_dump(text: str) -> list[ThreadStack]:
    """faulthandler's ``dump_traceback(all_threads=True)`` text, or a where-thread's answer in its
    format (each thread's name in brackets after its id), -> one ThreadStack per thread."""
    threads: list[ThreadStack] = []
    for line in text.splitlines():
        head = _THREAD.match(line)
        if head:
            threads.append(ThreadStack(int(head.group(2), 16), head.group(1) == "Current thread", [],
                                       head.group(3) or ""))
            continue
        frame = _FRAME.match(line)
        if frame and threads:
            threads[-1].frames.append(Frame(frame.group(1), int(frame.group(2)), frame.group(3).strip()))
    return threads
