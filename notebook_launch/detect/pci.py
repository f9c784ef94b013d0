"""The Google PCI functions of a machine, read once a while: what both TPU detections
(``xla``, ``torch_tpu``) start from, on every launch.

Why cached: finding them reads the vendor file of every PCI function (some 50 on a plain
server), twice per launch, a few milliseconds of a warm launch that otherwise takes tens
(issue 45). PCI functions do not come and go while a notebook runs, so the real machine's
(``root`` "/") are read again only after ``FRESH_FOR`` seconds; a test's fake machine (any other
root) is read every time.
"""
from __future__ import annotations

import glob
import os
import time

GOOGLE_PCI_VENDOR = "0x1ae0"
FRESH_FOR = 30.0   # seconds the real machine's list is kept
_cache: dict[str, tuple[float, list[tuple[str, str]]]] = {}


def google_functions(root: str) -> list[tuple[str, str]]:
    """(sysfs path, device id) of each Google PCI function under ``root``, in path order."""
    now = time.monotonic()
    cached = _cache.get(root) if root == "/" else None
    if cached is not None and now - cached[0] < FRESH_FOR:
        return list(cached[1])
    found = []
    for path in sorted(glob.glob(os.path.join(root, "sys/bus/pci/devices/*"))):
        try:
            if _read(os.path.join(path, "vendor")) != GOOGLE_PCI_VENDOR:
                continue
            found.append((path, _read(os.path.join(path, "device"))))
        except OSError:
            continue
    if root == "/":
        _cache[root] = (now, found)
    return list(found)


def _read(path: str) -> str:
    with open(path, encoding="ascii", errors="replace") as f:
        return f.read().strip().lower()
