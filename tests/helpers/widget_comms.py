"""A recording comm under real ipywidgets (7.7 and 8.x): it stands in for the browser and
records what each widget would send over IOPub. Only the comm is a stand-in; the widgets,
their traits and their sync logic are the real ones.

ipywidgets 8 opens comms through the ``comm`` package's ``create_comm``; ipywidgets 7 builds
``ipykernel.comm.Comm`` itself, which sends only when it has a kernel: there a stand-in
kernel with a comm manager (``RecordingKernelStandIn``) takes the messages.
"""
from __future__ import annotations

from typing import Any, Callable

import ipywidgets

IPYWIDGETS_7 = ipywidgets.__version__.startswith("7.")


def recording_comms(monkeypatch: Any, clock: Callable[[], float] | None = None) -> list[dict[str, Any]]:
    """Every widget comm opened from now on records what it would send to the frontend:
    dicts of time, type ("comm_open", "comm_msg", "comm_close"), comm_id and data."""
    sent: list[dict[str, Any]] = []

    def record(comm_id: str, msg_type: str, data: Any) -> None:
        sent.append({"time": clock() if clock else None, "type": msg_type, "comm_id": comm_id,
                     "data": data or {}})

    if IPYWIDGETS_7:
        _record_ipykernel_comms(monkeypatch, record)
    else:
        import comm as comm_module
        from comm.base_comm import BaseComm

        class RecordingComm(BaseComm):
            def publish_msg(self, msg_type, data=None, metadata=None, buffers=None, **keys):
                record(self.comm_id, msg_type, data)

        monkeypatch.setattr(comm_module, "create_comm", lambda **kw: RecordingComm(**kw))
    return sent


class RecordingKernelStandIn:
    """What ipykernel 6's Comm needs of a kernel to open, send and close: a comm manager."""

    class CommManager:
        def __init__(self) -> None:
            self.comms: dict[str, Any] = {}

        def register_comm(self, comm: Any) -> str:
            self.comms[comm.comm_id] = comm
            return comm.comm_id

        def unregister_comm(self, comm: Any) -> None:
            self.comms.pop(comm.comm_id, None)

    def __init__(self) -> None:
        self.comm_manager = self.CommManager()


def _record_ipykernel_comms(monkeypatch: Any, record: Callable[[str, str, Any], None]) -> None:
    import traitlets
    from ipykernel.comm import Comm
    from ipywidgets.widgets import widget as widget_module

    stand_in = RecordingKernelStandIn()

    class RecordingComm(Comm):
        kernel = traitlets.Any(stand_in)

        def _publish_msg(self, msg_type, data=None, metadata=None, buffers=None, **keys):
            record(self.comm_id, msg_type, data)

    monkeypatch.setattr(widget_module, "Comm", RecordingComm)
