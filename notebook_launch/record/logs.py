"""The run's log files in the parent: one per rank, every whole line a rank printed
(``line_splitter`` makes the lines), and ``metrics.jsonl``.

What writes to them is typed against ``LogWriter``: a launch's supervisor writes to its
``RunLogs``, one call on persistent ranks to a ``LogSection`` of the pool's ``RunLogs``
(``RunLogs.section``). The log files on disk keep everything; nothing in memory does.
"""
from __future__ import annotations

import errno
import itertools
import logging
import os
import time
from pathlib import Path
from typing import IO, Callable, Iterable, Protocol

from .metrics import MetricsFile
from ..notebook.notebook_streams import OUT
from ..errors import LaunchArgumentError
from .run_folders import (PRIVATE_FOLDER, LiveRunFolder, Pruning, Retention, default_log_root, fallback_log_root,
                          private_open, prune_as_a_run_starts, retention_from_environment)

__all__ = ["LogSection", "LogWriter", "RunLogs", "default_log_root", "fallback_log_root", "make_run_id"]

log = logging.getLogger("notebook_launch")


class LogWriter(Protocol):
    """What a supervisor, the elastic agent and a ``session.Session`` write a run's output
    through: a launch's ``RunLogs``, or a ``LogSection`` (one call on persistent ranks).
    ``close`` ends what the writer stands for (the run's files, or the call's section)."""

    path: Path

    def write_line(self, local_rank: int, stream: str, text: str) -> None: ...

    def write_block(self, local_rank: int, text: str) -> None: ...

    def write_metrics(self, rank: int, series: dict[str, list[int | float]] | None) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


_launches = itertools.count()


def make_run_id() -> str:
    """Sorts by start time (then launch count); the pid keeps kernels apart."""
    now = time.time()
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return f"{stamp}-{int(now * 1000) % 1000:03d}{next(_launches) % 1000:03d}{os.getpid() % 10000:04d}"


class RunLogs:
    """The run folder: rank<N>.log per local rank (stdout and stderr lines in
    arrival order, stderr lines marked), plus the failing rank's traceback.

    Logging never ends a run: a write that fails (a full disk, a folder gone) stops
    the logging, says so once through ``on_problem`` (the cell), and the run goes on.
    A default log root that cannot be written falls back to a temporary folder
    (``notes`` says where); a ``log_dir`` the user chose that cannot be used is a
    LaunchArgumentError, before any rank starts.

    In the default root (and its fallback) the run gets a new folder, live while the run
    goes on, and the earlier runs' folders are cut to the retention bounds while the ranks
    start (notebook_launch.record.run_folders says the rule; ``close`` waits for it); a ``log_dir``
    the user chose is theirs: nothing in it is removed."""

    def __init__(self, run_id: str, local_ranks: Iterable[int], global_ranks: Iterable[int],
                 log_dir: str | os.PathLike[str] | None = None,
                 on_problem: Callable[[str], None] | None = None) -> None:
        self.notes: list[str] = []     # for the launch line: where the logs went, if not where expected
        self._on_problem = on_problem or _tell_the_cell
        self._stopped_because: str | None = None
        self._files: dict[int, IO[str]] = {}
        self.metrics: MetricsFile | None = None
        self._live: LiveRunFolder | None = None
        self._pruning: Pruning | None = None
        names = {local: f"rank{global_rank}.log" for local, global_rank in zip(local_ranks, global_ranks)}
        self.local_ranks = tuple(names)   # a file each, by local rank
        if log_dir is not None:
            self.path = Path(log_dir).expanduser()
            try:
                self._open(names)
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE):
                    raise
                raise LaunchArgumentError(
                    f"log_dir={os.fspath(log_dir)!r} cannot be used: {_reason(exc)}. Pass a folder you "
                    f"can write to, or log_dir=None for a new folder per run in the user cache.") from None
            return
        retention = retention_from_environment()
        root = default_log_root()
        self.path = root / run_id
        try:
            self._open_live(root, run_id, names, retention)
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE):
                raise
            # The earlier runs' folders there are bounded all the same: on a full disk this frees
            # what they held over the bounds, for the fallback folder (often the same disk)
            prune_as_a_run_starts(root, retention, spare=run_id)
            fallback = fallback_log_root()
            self.notes.append(f"cannot write logs under {root} ({_reason(exc)}); this run's logs go to "
                              f"{fallback / run_id} (set NOTEBOOK_LAUNCH_LOG_DIR or log_dir= to choose)")
            self.path = fallback / run_id
            try:
                self._open_live(fallback, run_id, names, retention)
            except OSError as second:
                if second.errno in (errno.EMFILE, errno.ENFILE):
                    raise
                raise LaunchArgumentError(
                    f"cannot write this run's logs under {root} ({_reason(exc)}) nor under {fallback} "
                    f"({_reason(second)}). Set NOTEBOOK_LAUNCH_LOG_DIR, or pass log_dir=, naming a folder "
                    f"you can write to.") from None

    def _open_live(self, root: Path, run_id: str, names: dict[int, str], retention: Retention) -> None:
        """Make this run's folder, live until ``close``, and bound the earlier runs' folders
        beside it in the background (``close`` waits for that)."""
        self._live = LiveRunFolder(root, run_id)
        try:
            self._open(names)
        except BaseException:
            self._live.release()
            self._live = None
            raise
        self._pruning = Pruning(root, retention, spare=run_id)

    def _open(self, names: dict[int, str]) -> None:
        """Create the folder and every rank's file; on failure close what was opened."""
        try:
            self.path.mkdir(mode=PRIVATE_FOLDER, parents=True, exist_ok=True)
            for local, name in names.items():
                self._files[local] = private_open(self.path / name, "w", encoding="utf-8", errors="replace",
                                                  buffering=1 << 16)
        except OSError:
            self._close_files()
            raise
        self.metrics = MetricsFile(self.path)

    def write_line(self, local_rank: int, stream: str, text: str) -> None:
        if self._stopped_because is not None:
            return
        f = self._files[local_rank]
        try:
            if stream == "stderr":
                f.write("[stderr] ")
            f.write(text)
            f.write("\n")
        except OSError as exc:
            self._stop_logging(exc)

    def write_block(self, local_rank: int, text: str) -> None:
        if self._stopped_because is not None:
            return
        try:
            self._files[local_rank].write(text if text.endswith("\n") else text + "\n")
        except OSError as exc:
            self._stop_logging(exc)

    def write_to_all(self, text: str) -> None:
        """One block in every rank's file: a call's title, a restart of persistent ranks."""
        for local_rank in self.local_ranks:
            self.write_block(local_rank, text)

    def section(self, title: str) -> LogSection:
        """The run's files as one call on persistent ranks writes them: under a title line in
        every rank's file; closing the section flushes the files, which stay open (the pool's)."""
        self.write_to_all(f"----- {title} -----")
        return LogSection(self)

    def write_metrics(self, rank: int, series: dict[str, list[int | float]] | None) -> None:
        """Every value a progress event carries, to metrics.jsonl (``rank``: global rank)."""
        if not series or self._stopped_because is not None or self.metrics is None:
            return
        try:
            self.metrics.write(rank, series)
        except OSError as exc:
            self._stop_logging(exc)

    def flush(self) -> None:
        if self._stopped_because is not None:
            return
        try:
            for f in self._files.values():
                f.flush()
            if self.metrics is not None:
                self.metrics.flush()
        except OSError as exc:
            self._stop_logging(exc)

    def close(self) -> None:
        if self._stopped_because is None:
            self.flush()
        self._close_files()
        if self._live is not None:
            self._live.release()
        if self._pruning is not None:
            self._pruning.wait()

    def _stop_logging(self, exc: OSError) -> None:
        """Give up on the log files for the rest of the run, and say so once."""
        self._stopped_because = _reason(exc)
        self._close_files()
        self._on_problem(f"notebook_launch: stopped writing the logs in {self.path} ({self._stopped_because}); "
                         f"the run goes on, and its output is still shown here")

    def _close_files(self) -> None:
        if self.metrics is not None:
            self.metrics.close()
        for f in self._files.values():
            try:
                f.close()
            except OSError:   # the buffered rest cannot be written (the disk that is full)
                log.debug("closing a rank log failed", exc_info=True)
        self._files.clear()


class LogSection:
    """One call's part of a pool's ``RunLogs`` (made by ``RunLogs.section``): writes go to the
    run's files; ``close`` ends the section, not the files (they live as long as the pool)."""

    def __init__(self, logs: RunLogs) -> None:
        self.logs = logs
        self.path = logs.path

    def write_line(self, local_rank: int, stream: str, text: str) -> None:
        self.logs.write_line(local_rank, stream, text)

    def write_block(self, local_rank: int, text: str) -> None:
        self.logs.write_block(local_rank, text)

    def write_metrics(self, rank: int, series: dict[str, list[int | float]] | None) -> None:
        self.logs.write_metrics(rank, series)

    def flush(self) -> None:
        self.logs.flush()

    def close(self) -> None:
        self.logs.flush()


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc) or type(exc).__name__


def _tell_the_cell(text: str) -> None:
    print(text, file=OUT, flush=True)
