"""torch elastic's failure records for a LaunchError, so ``except ChildFailedError`` code
written for Accelerate's launcher (which raises it from torch elastic) gets the fields it reads.

``failures`` maps each failed global rank to a ``ProcessFailure`` as torch fills it: ``local_rank``,
``pid``, ``exitcode`` (negative signal number when killed), ``error_file`` (a JSON error file
in torch's format, written in the run's log folder, or "<N/A>"), ``message`` and ``timestamp``;
we add ``rank`` (the global rank) for readers that want it next to the rest.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..record.run_folders import private_open

log = logging.getLogger("notebook_launch")
NOT_AVAILABLE = "<N/A>"


@dataclass(frozen=True)
class RankFailureFacts:
    """What we know about one failed (or stopped-on-timeout) rank when the error is built."""
    rank: int
    local_rank: int
    pid: int
    exitcode: int          # torch's convention: -signum when killed by a signal
    headline: str
    traceback: str = ""


def exitcode_of(status: Any) -> int:
    """A wait status ("exit", code) / ("signal", signum) as torch reports it."""
    if not status:
        return -1
    kind, value = status
    return -int(value) if kind == "signal" else int(value)


def write_error_file(folder: str | None, facts: RankFailureFacts) -> str:
    """torch's error file ({"message": {"message", "extraInfo": {"py_callstack", "timestamp"}}});
    only for a Python exception (torch writes none for a signal). "<N/A>" when it cannot be written."""
    if not facts.traceback or not folder:
        return NOT_AVAILABLE
    path = os.path.join(folder, f"rank{facts.rank}.error.json")
    data = {"message": {"message": facts.headline,
                        "extraInfo": {"py_callstack": facts.traceback, "timestamp": str(int(time.time()))}}}
    try:
        with private_open(Path(path), "w", encoding="utf-8") as f:
            json.dump(data, f)
    except OSError as exc:
        log.debug("could not write the torch error file %s: %s", path, exc)
        return NOT_AVAILABLE
    return path


def process_failures(facts: list[RankFailureFacts], log_dir: str | None) -> dict[int, Any]:
    """{global rank: torch ProcessFailure} (plain records when torch elastic is unavailable)."""
    failures: dict[int, Any] = {}
    for fact in facts:
        error_file = write_error_file(log_dir, fact)
        record: Any = _torch_record(fact, error_file) or _PlainFailure(fact, error_file)
        record.rank = fact.rank
        if error_file == NOT_AVAILABLE and fact.exitcode >= 0:
            record.message = fact.headline   # torch's text would be its generic "To enable traceback" hint
        failures[fact.rank] = record
    return failures


def _torch_record(fact: RankFailureFacts, error_file: str) -> Any:
    """torch's ProcessFailure (it reads the error file itself), or None without torch elastic.
    Only where torch is imported already: a notebook that never imported torch cannot be
    catching torch's ChildFailedError, and a failure must not cost it a second of imports."""
    if "torch" not in sys.modules:
        return None
    try:
        from torch.distributed.elastic.multiprocessing.errors import ProcessFailure
        return ProcessFailure(local_rank=fact.local_rank, pid=fact.pid, exitcode=fact.exitcode,
                              error_file=error_file)
    except Exception as exc:   # why: a torch build without torch.distributed, or an unreadable file
        log.debug("torch elastic's ProcessFailure unavailable for rank %d (%s)", fact.rank, exc)
        return None


class _PlainFailure:
    """The same fields as torch's ProcessFailure, for a torch without torch.distributed."""

    def __init__(self, fact: RankFailureFacts, error_file: str) -> None:
        self.rank, self.local_rank, self.pid, self.exitcode = fact.rank, fact.local_rank, fact.pid, fact.exitcode
        self.error_file = error_file
        self.message: Any = fact.headline
        self.timestamp = int(time.time())

    def signal_name(self) -> str:
        import signal
        try:
            return signal.Signals(-self.exitcode).name if self.exitcode < 0 else NOT_AVAILABLE
        except ValueError:
            return NOT_AVAILABLE
