"""A real memory cgroup for tests of the kernel's out-of-memory killer: a process that joins it and
touches more than its limit is OOM-killed by the kernel itself, which writes its record
(``/dev/kmsg``) and counts it (``memory.oom_control``). Needs root and the cgroup v1 memory
controller (these machines' hierarchy); a test skips without them."""
from __future__ import annotations

import contextlib
import os
import time
import uuid
from typing import Iterator

import pytest

from notebook_launch.supervise import kernel_oom

CGROUP_V1 = "/sys/fs/cgroup/memory"


@contextlib.contextmanager
def memory_cgroup(limit: int) -> Iterator[str]:
    """A v1 memory cgroup of ``limit`` bytes (no swap), below this process's own memory cgroup (so
    it stays inside whatever limits this process has); removed afterwards, failed or not."""
    parent = kernel_oom.memory_cgroup_of(os.getpid())
    if os.geteuid() != 0 or parent is None or not parent.startswith(CGROUP_V1) \
            or not os.path.exists(f"{parent}/memory.limit_in_bytes"):
        pytest.skip("needs root and the cgroup v1 memory controller")
    path = f"{parent}/notebook-launch-oom-test-{uuid.uuid4().hex[:8]}"
    os.mkdir(path)
    try:
        with open(f"{path}/memory.limit_in_bytes", "w") as file:
            file.write(str(limit))
        if os.path.exists(f"{path}/memory.memsw.limit_in_bytes"):   # no swapping out instead of the kill
            with open(f"{path}/memory.memsw.limit_in_bytes", "w") as file:
                file.write(str(limit))
        yield path
    finally:
        deadline = time.monotonic() + 10
        while True:
            try:
                os.rmdir(path)
                break
            except OSError:   # a task still in it: the launch ends every rank, so it is leaving
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


def join_and_fill(cgroup: str) -> None:
    """This process joins ``cgroup``, then touches memory until the kernel's OOM killer ends it."""
    with open(f"{cgroup}/cgroup.procs", "w") as file:
        file.write(str(os.getpid()))
    fill()


def fill() -> None:
    hog = []
    while True:
        hog.append(b"\x01" * (8 << 20))


def kernel_log_readable() -> bool:
    return kernel_oom.kernel_log_kills(time.monotonic()) is not None
