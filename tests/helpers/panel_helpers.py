"""Helpers for the panel tests: a display that keeps the final run state, and a
recording comm that stands in for the browser (the widgets themselves are real)."""
from __future__ import annotations

from notebook_launch.display.base import Display
from notebook_launch.record.state import RunState


class KeepStateDisplay(Display):
    """A real Display that remembers the state it was shown, so a test can read it (passed
    as a launch's ``ui=``, as a user passes a display of their own)."""
    state: RunState   # the run's, from its start

    def __init__(self, line_prefix=None):
        super().__init__(line_prefix)
        self.closed = False
        self.lines = []

    def start(self, state):
        self.state = state

    def line(self, state, local_rank, stream, text):
        self.lines.append((local_rank, stream, text))

    def close(self, state):
        self.state = state
        self.closed = True


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


# A notebook cell whose ``keeping()`` is the display a launch would choose there (the real panel
# still draws), passed as ``ui=keeping()``, that keeps the launch's final RunState in ``kept``: a
# later cell prints what the panel knew, e.g. every bar of a rank (``bars_of``).
KEEP_STATES_CELL = """
from notebook_launch.display import choose_display as _choose_display
kept = []

def keeping():
    display = _choose_display("auto")
    close = display.close
    def keep(state):
        kept.append(state)
        close(state)
    display.close = keep
    return display

def bars_of(rank=0):
    rs = kept[-1].ranks[rank]
    main = rs.main_bar
    return [(b.desc, b.n, b.total, b.closed) for b in rs.bars.values()], main.desc if main else None
"""


def panel_of(display):
    """The notebook panel a chosen display draws: a widget or HTML panel is drawn once its run
    lasts (``display.deferred.DeferredPanel``), so what ``choose_display`` returns makes it."""
    from notebook_launch.display.deferred import DeferredPanel
    return display._make() if isinstance(display, DeferredPanel) else display
