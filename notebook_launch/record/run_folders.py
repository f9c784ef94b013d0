"""The run folders under the default log root, and the rule that bounds them.

Every launch (and every persistent-ranks session) without ``log_dir=`` writes its rank logs to
a new folder ``<root>/<run id>``, root ``~/.cache/notebook_launch/runs`` (``$XDG_CACHE_HOME``,
or ``$NOTEBOOK_LAUNCH_LOG_DIR`` instead). Retention, applied when a run starts and by
``notebook-launch clean``: the folders of earlier runs are removed, oldest first, until at most
``KEEP_RUNS`` (100) remain and together they hold at most ``KEEP_MEGABYTES`` (1024 MB, what they
take on disk); ``NOTEBOOK_LAUNCH_KEEP_RUNS`` and ``NOTEBOOK_LAUNCH_KEEP_MB`` change the two
bounds. A count alone let one chatty run keep 160 MB for a hundred runs.

A run applies the rule in a thread of its own (``Pruning``), started once its folder is made and
waited for when its logs close: measuring and removing a hundred folders took ~15 ms, which the
first launch of a kernel paid before any rank started (later launches measure only new folders).
On a disk nearly full (less than ``LOW_DISK_BYTES`` free) the run waits for it before its ranks
write: the earlier runs' folders may hold the room its logs need.

The folder of a run that is still going is never removed, whatever the bounds. A live run
holds an exclusive ``flock`` on the ``.live`` file in its folder (its pid written inside, for
people): the kernel drops the lock when the last process holding the file ends, killed
included, so a crashed run never looks live, and forked ranks, which inherit the file,
keep their run live while any of them runs. The folder is made under a hidden name, locked,
then renamed into place, so no one sees a run folder that is not yet locked.
Only names of the run-id form are ever touched.
"""
from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import shutil
import stat
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Iterable

from ..errors.best_effort import best_effort
from ..errors import LaunchArgumentError
from ..wire.fork_locks import ForkRenewedLock

log = logging.getLogger("notebook_launch")

KEEP_RUNS = 100
KEEP_MEGABYTES = 1024
MEGABYTE = 10**6
LIVE_FILE = ".live"
KEEP_RUNS_VARIABLE = "NOTEBOOK_LAUNCH_KEEP_RUNS"
KEEP_MB_VARIABLE = "NOTEBOOK_LAUNCH_KEEP_MB"
RUN_NAME = re.compile(r"^\d{8}-\d{6}-\d+$")
STARTING_PREFIX = ".starting-"


def default_log_root() -> Path:
    configured = os.environ.get("NOTEBOOK_LAUNCH_LOG_DIR")
    if configured:
        return Path(configured).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "notebook_launch" / "runs"


def fallback_log_root() -> Path:
    """Where logs go when the default root cannot be written: a per-user folder in the temp dir
    (shared by every user of the machine: made ours alone, see ``private_folder``)."""
    user = os.getuid() if hasattr(os, "getuid") else os.getpid()
    return Path(tempfile.gettempdir()) / f"notebook_launch-{user}" / "runs"


PRIVATE_FOLDER = 0o700   # what a run writes (its output, the pickled job, metrics) is its user's alone
PRIVATE_FILE = 0o600


def private_folder(path: Path) -> None:
    """Make ``path`` (and missing parents) readable by this user only, as a run's folders are. In
    the shared temp dir each folder on the way is checked before anything goes in it: a real folder
    of ours (another user could have made it first, or left a link to somewhere else), closed to
    others if an older version made it with the usual umask."""
    temp = Path(tempfile.gettempdir())
    if temp not in path.parents:
        path.mkdir(mode=PRIVATE_FOLDER, parents=True, exist_ok=True)
        return
    folder = temp
    for part in path.relative_to(temp).parts:
        folder = folder / part
        try:
            folder.mkdir(mode=PRIVATE_FOLDER)
        except FileExistsError:
            pass
        info = os.lstat(folder)
        if not stat.S_ISDIR(info.st_mode) or (hasattr(os, "getuid") and info.st_uid != os.getuid()):
            raise OSError(errno.EACCES, f"{folder} in the shared temp folder is not this user's own folder")
        if info.st_mode & 0o077:
            os.chmod(folder, PRIVATE_FOLDER)


def private_open(path: Path, mode: str = "w", **kwargs: Any) -> IO[Any]:
    """``open`` for a file of the run: created readable by this user only."""
    return open(path, mode, opener=lambda name, flags: os.open(name, flags, PRIVATE_FILE), **kwargs)


@dataclass(frozen=True)
class Retention:
    """The two bounds on the earlier runs' folders: how many, and how many bytes together."""
    keep_runs: int = KEEP_RUNS
    keep_bytes: int = KEEP_MEGABYTES * MEGABYTE

    def describe(self) -> str:
        return f"the newest {self.keep_runs} runs, at most {self.keep_bytes / MEGABYTE:g} MB together"


def retention_from_environment() -> Retention:
    """The bounds, with ``NOTEBOOK_LAUNCH_KEEP_RUNS`` / ``NOTEBOOK_LAUNCH_KEEP_MB`` applied; a value
    that is not a number >= 0 is a LaunchArgumentError naming the variable (before any rank starts)."""
    runs = os.environ.get(KEEP_RUNS_VARIABLE, "").strip()
    megabytes = os.environ.get(KEEP_MB_VARIABLE, "").strip()
    keep_runs, keep_mb = KEEP_RUNS, float(KEEP_MEGABYTES)
    if runs:
        try:
            keep_runs = int(runs)
        except ValueError:
            keep_runs = -1
        if keep_runs < 0:
            raise LaunchArgumentError(
                f"{KEEP_RUNS_VARIABLE}={runs!r} is not a whole number >= 0: it is how many earlier run "
                f"folders to keep; set a number or unset it for the default ({KEEP_RUNS})")
    if megabytes:
        try:
            keep_mb = float(megabytes)
        except ValueError:
            keep_mb = -1.0
        if not 0 <= keep_mb < float("inf"):
            raise LaunchArgumentError(
                f"{KEEP_MB_VARIABLE}={megabytes!r} is not a number of megabytes >= 0: it bounds the "
                f"earlier run folders' total size; set a number or unset it for the default ({KEEP_MEGABYTES})")
    return Retention(keep_runs, int(keep_mb * MEGABYTE))


# --- the folders -------------------------------------------------------------------------

@dataclass
class RunFolder:
    path: Path
    size: int            # bytes on disk (allocated blocks), as du counts them
    last_written: float  # newest mtime of the folder and what it holds

    @property
    def name(self) -> str:
        return self.path.name


# (bytes, newest mtime) of folders found finished: nothing writes to a run's folder once its run
# is over, so a kernel measures each one once, not on every launch (a launch costs tens of ms).
_finished: dict[str, tuple[int, float]] = {}


def list_run_folders(root: Path) -> list[RunFolder]:
    """The run folders under ``root``, oldest first (run ids sort by start time); none if
    ``root`` cannot be read."""
    try:
        with os.scandir(root) as entries:
            paths = sorted(entry.path for entry in entries
                           if RUN_NAME.match(entry.name) and entry.is_dir(follow_symlinks=False))
    except OSError:
        log.debug("cannot list the log root %s", root, exc_info=True)
        return []
    folders = []
    for path in paths:
        usage = _finished.get(path)
        if usage is None:
            usage = _usage(path)
            if live_pid(Path(path)) is None:
                _finished[path] = usage
        folders.append(RunFolder(Path(path), *usage))
    return folders


def _usage(path: str) -> tuple[int, float]:
    """(bytes on disk, newest mtime) of a folder, recursively; what cannot be read counts 0."""
    size, last = 0, 0.0
    pending = [path]
    while pending:
        folder = pending.pop()
        try:
            status = os.stat(folder)
            size += status.st_blocks * 512
            last = max(last, status.st_mtime)
            with os.scandir(folder) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        pending.append(entry.path)
                        continue
                    status = entry.stat(follow_symlinks=False)
                    size += status.st_blocks * 512
                    last = max(last, status.st_mtime)
        except OSError:
            continue
    return size, last


def live_pid(path: Path) -> int | None:
    """The pid written in a live run's ``.live`` file (0 if unreadable); None if the run is not live:
    no such file, or no process holds its lock."""
    try:
        fd = os.open(path / LIVE_FILE, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            text = os.read(fd, 32).decode("ascii", "replace").strip()
            return int(text) if text.isdigit() else 0
        return None   # we got the lock: nobody holds it
    finally:
        os.close(fd)


def select_for_removal(folders: list[RunFolder], retention: Retention | None = None,
                       older_than: float | None = None, now: float | None = None) -> list[RunFolder]:
    """Which of ``folders`` (oldest first) go: the oldest, one by one, until the rest are within
    ``retention``'s bounds, and (``older_than`` seconds) every folder last written longer ago.
    A live run's folder is never chosen; it counts towards the bounds all the same."""
    now = time.time() if now is None else now
    chosen: list[RunFolder] = []
    count, total = len(folders), sum(f.size for f in folders)
    for folder in folders:
        over = retention is not None and (count > retention.keep_runs or total > retention.keep_bytes)
        stale = older_than is not None and now - folder.last_written > older_than
        if not (over or stale) or live_pid(folder.path) is not None:
            continue
        chosen.append(folder)
        count, total = count - 1, total - folder.size
    return chosen


def remove(folders: Iterable[RunFolder]) -> list[RunFolder]:
    """Remove the folders; returns those removed (one that cannot be is logged and skipped).
    The live check is repeated just before: a run may have started in the folder meanwhile
    (it cannot: names are new per run, but a folder is only ever removed unlocked)."""
    removed = []
    for folder in folders:
        if live_pid(folder.path) is not None:
            continue
        _finished.pop(str(folder.path), None)
        try:
            shutil.rmtree(folder.path)
        except OSError:
            log.debug("cannot remove the old run folder %s", folder.path, exc_info=True)
            continue
        removed.append(folder)
    return removed


def prune(root: Path, retention: Retention, *, spare: str | None = None) -> list[RunFolder]:
    """The retention rule, as a run starts: bound the earlier runs' folders under ``root``.
    ``spare``: the name of the starting run's own folder, which is not an earlier run (neither
    counted nor removed)."""
    return remove(select_for_removal([f for f in list_run_folders(root) if f.name != spare], retention))


_pruning_lock = ForkRenewedLock()   # one prune at a time in a process (launches in two threads)


def prune_as_a_run_starts(root: Path, retention: Retention, spare: str) -> None:
    """``prune`` for a starting run (``spare``: its folder); a prune that fails is logged, never
    raised: it must not end the run."""
    with best_effort("pruning the run folders under %s failed", root), _pruning_lock:
        prune(root, retention, spare=spare)


# Less free space than this under the log root, and a starting run bounds the earlier runs' folders
# before its ranks write: a run that came after one that filled the disk lost every line of its log
# (its first writes met 'No space left on device' while the thread was still removing that folder;
# item 14 of the benchmarks saw it with a 1 GB run on a 64 MB disk).
LOW_DISK_BYTES = 256 * MEGABYTE


def free_bytes(root: Path) -> int | None:
    """Bytes an unprivileged writer can still use on ``root``'s disk (None: not known, no root yet)."""
    try:
        status = os.statvfs(root)
    except OSError:
        return None
    return status.f_bavail * status.f_frsize


def prune_first(free: int | None) -> bool:
    """Whether the earlier runs' folders must be bounded before this run writes a line: only on a disk
    nearly full, where they may hold the room its logs need (elsewhere it goes on beside the ranks)."""
    return free is not None and free < LOW_DISK_BYTES


class Pruning:
    """``prune_as_a_run_starts`` in a thread of its own: the ranks start without waiting for it
    (``wait`` when the run's logs close, so a run still leaves the folders bounded when it returns).
    On a disk nearly full (``prune_first``) it runs before returning instead, as the run starts."""

    def __init__(self, root: Path, retention: Retention, spare: str) -> None:
        self._thread = threading.Thread(target=prune_as_a_run_starts, args=(root, retention, spare),
                                        name="notebook_launch-prune", daemon=True)
        self._thread.start()
        if prune_first(free_bytes(root)):
            self._thread.join()

    def wait(self) -> None:
        self._thread.join()


# --- a live run's folder -------------------------------------------------------------------

class LiveRunFolder:
    """Makes ``<root>/<run_id>`` and holds its ``.live`` lock until ``release``."""

    def __init__(self, root: Path, run_id: str) -> None:
        self.path = root / run_id
        starting = root / f"{STARTING_PREFIX}{run_id}"
        private_folder(root)
        starting.mkdir(mode=PRIVATE_FOLDER)
        self._file: IO[str] | None = None
        try:
            self._file = private_open(starting / LIVE_FILE, "w", encoding="ascii")
            fcntl.flock(self._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            self._file.write(f"{os.getpid()}\n")
            self._file.flush()
            os.rename(starting, self.path)
        except BaseException:
            self.release()
            shutil.rmtree(starting, ignore_errors=True)
            raise

    def release(self) -> None:
        """The run is over: the folder stays, no longer live. Idempotent."""
        if self._file is None:
            return
        try:
            os.unlink(self.path / LIVE_FILE)
        except OSError:
            pass
        try:
            self._file.close()   # drops our hold on the lock (forked ranks that still run keep theirs)
        except OSError:
            pass
        self._file = None
