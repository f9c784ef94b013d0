"""Helpers for the panel tests: a display that keeps the final run state, and a
recording comm that stands in for the browser (the widgets themselves are real)."""
from __future__ import annotations

import contextlib

from notebook_launch.display.base import Display


class KeepStateDisplay(Display):
    """A real Display that remembers the state it was shown, so a test can read it."""

    def __init__(self, line_prefix=None):
        super().__init__(line_prefix)
        self.state = None
        self.closed = False
        self.lines = []

    def start(self, state):
        self.state = state

    def line(self, state, local_rank, stream, text):
        self.lines.append((local_rank, stream, text))

    def close(self, state):
        self.state = state
        self.closed = True


@contextlib.contextmanager
def keep_state(monkeypatch):
    """Make the next launches use a KeepStateDisplay; yields the list of displays made."""
    import notebook_launch.run as run_module
    made = []

    def choose(ui="auto", *, line_prefix=None, **options):
        display = KeepStateDisplay(line_prefix)
        made.append(display)
        return display

    monkeypatch.setattr(run_module, "choose_display", choose)
    yield made


def recording_comms(monkeypatch, clock=None):
    """Every widget comm opened from now on records what it would send to the frontend."""
    import comm as comm_module
    from comm.base_comm import BaseComm

    sent = []

    class RecordingComm(BaseComm):
        def publish_msg(self, msg_type, data=None, metadata=None, buffers=None, **keys):
            sent.append({"time": clock() if clock else None, "type": msg_type,
                         "comm_id": self.comm_id, "data": data or {}})

    monkeypatch.setattr(comm_module, "create_comm", lambda **kw: RecordingComm(**kw))
    return sent


# A notebook cell that keeps every launch's final RunState in ``kept`` (the real display still
# draws): a later cell prints what the panel knew, e.g. every bar of a rank (``BARS_OF``).
KEEP_STATES_CELL = """
import notebook_launch.run as _run_module
_real_choose = _run_module.choose_display
kept = []

def _keeping_choose(*args, **kwargs):
    display = _real_choose(*args, **kwargs)
    close = display.close
    def keep(state):
        kept.append(state)
        close(state)
    display.close = keep
    return display

_run_module.choose_display = _keeping_choose

def bars_of(rank=0):
    rs = kept[-1].ranks[rank]
    main = rs.main_bar
    return [(b.desc, b.n, b.total, b.closed) for b in rs.bars.values()], main.desc if main else None
"""
