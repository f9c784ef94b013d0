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
from typing import Callable, TypeVar

T = TypeVar("T")

GOOGLE_PCI_VENDOR = "0x1ae0"
FRESH_FOR = 30.0   # seconds the real machine's list is kept
_cache: dict[str, tuple[float, list[tuple[str, str]]]] = {}
_kept: dict[str, tuple[float, object]] = {}


def kept(key: str, read: Callable[[], T]) -> T:
    """``read()``, the real machine's answer kept ``FRESH_FOR`` seconds under ``key``, as the PCI
    list is: what else the TPU detection looks at on every launch (the /dev/accel* and VFIO files,
    whether torch_xla is installed: about 1 ms of a warm launch's CPU each time). Only for facts
    of this machine; a test's fake one is read every time by its callers."""
    now = time.monotonic()
    found = _kept.get(key)
    if found is not None and now - found[0] < FRESH_FOR:
        return found[1]  # type: ignore[return-value]
    value = read()
    _kept[key] = (now, value)
    return value


def forget(key: str) -> None:
    """Read ``key`` afresh next time (a launch about to fail on a kept answer checks it again)."""
    _kept.pop(key, None)


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
