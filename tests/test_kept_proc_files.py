"""record.proc_usage.KeptProcFiles: /proc files kept open and read with pread (issue 45's
persistent calls read each rank's cgroup as the ranks go idle)."""
from __future__ import annotations

import os
import subprocess
import sys

from notebook_launch.record.proc_usage import KeptProcFiles, read_text


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_a_kept_file_reads_what_the_file_says_now():
    files = KeptProcFiles()
    try:
        before = files.read("/proc/self/status")
        assert before is not None and "VmRSS" in before
        grown = bytearray(64 << 20)   # resident memory the status must show on the next read
        grown[::4096] = b"x" * len(grown[::4096])
        after = files.read("/proc/self/status")
        assert after is not None
        rss = [int(line.split()[1]) for text in (before, after) for line in text.splitlines()
               if line.startswith("VmRSS:")]
        assert rss[1] - rss[0] >= 60 << 10, rss   # kB: the file was read afresh, not the first text again
        assert files.read(f"/proc/{os.getpid()}/cgroup") == read_text(f"/proc/{os.getpid()}/cgroup")
    finally:
        files.close()


def test_a_process_that_ended_reads_as_none_and_its_file_is_closed():
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    files = KeptProcFiles()
    fds = open_fds()
    try:
        path = f"/proc/{child.pid}/cgroup"
        assert files.read(path) is not None
        kept = open_fds() - fds
        assert len(kept) == 1   # kept: one fd
        child.communicate(b"")   # it ends and is reaped: its pid could be anyone's now
        assert files.read(path) is None   # never another process's text under the same pid
        assert not kept & open_fds()
    finally:
        child.kill()
        child.wait()
        files.close()


def test_keep_only_and_close_close_every_fd_once():
    fds = open_fds()
    files = KeptProcFiles()
    paths = ["/proc/self/stat", "/proc/self/statm", "/proc/self/cgroup"]
    for path in paths:
        assert files.read(path) is not None
    assert files.read("/proc/no-such-file") is None   # not kept
    assert len(open_fds() - fds) == 3
    files.keep_only({paths[0]})
    assert len(open_fds() - fds) == 1
    files.close()
    files.close()   # a second close closes nothing again
    assert open_fds() == fds
