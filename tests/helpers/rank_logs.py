"""A rank's log as the rank wrote it: without the lines the notebook adds about its resources (once
its own pages were read, then once a minute, and one over its whole life as it ends:
``supervise/resources.py``), which a test of what reached the log must not count."""
from __future__ import annotations

import os

RESOURCE_LINE = "[notebook_launch] resources"


def written_by_rank(path: str | os.PathLike[str]) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return "".join(line for line in f if not line.startswith(RESOURCE_LINE))
