"""The rank's half of the display relay: in a rank forked from a Jupyter kernel, IPython's
display() reaches the notebook.

A forked rank inherits the kernel's IPython shell, so ``display()``,
``update_display``, ``DisplayHandle.update`` and ``clear_output`` (and what
uses them, such as the Transformers Trainer's notebook progress) all call the
shell's display publisher. That publisher sends
on the kernel's zmq socket, which ipykernel refuses from a forked process
("attempted to send message from fork"), so the output would be lost. Here
the publisher sends each call over the rank's event pipe instead; the
notebook re-publishes it (``display/display_relay.py``, the notebook's half of this relay:
same name, the package says which side), so it appears in the cell.

A widget made in a rank (ipywidgets, or anything that displays one) cannot be relayed:
its model lives in the rank's process and talks over comm messages the fork cannot send,
so the notebook would get a view of a model it never heard of and show nothing. Its
display becomes a one-line note on the rank's stderr instead (in the cell, tagged with
the rank, and in its log), once per rank per kind of widget, and its updates are dropped.
"""
from __future__ import annotations

import logging
import os
import pickle
import sys
from typing import Any

from ...wire import protocol

log = logging.getLogger("notebook_launch")
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
_noted_widget_kinds: set[str] = set()   # per process, so per rank (a forked child starts afresh)
_widget_display_ids: set[str] = set()
_noted_by = os.getpid()


def _this_process_notes() -> None:
    """A process a rank forked (a rank of a launch it makes) notes its own widgets: checked by pid
    at use, not by an at-fork hook, so that importing the module registers nothing."""
    global _noted_by
    if _noted_by != os.getpid():
        _noted_widget_kinds.clear()
        _widget_display_ids.clear()
        _noted_by = os.getpid()


def install(spec: Any = None) -> None:
    """A rank hook (``installs.RANK_HOOKS``): ``install_display_relay``."""
    install_display_relay()


def install_display_relay() -> bool:
    """Send this process's IPython display calls to the notebook; False when this rank
    was not forked from a Jupyter kernel (nothing to relay: display() prints text)."""
    interactiveshell = sys.modules.get("IPython.core.interactiveshell")
    if interactiveshell is None or "ipykernel.zmqshell" not in sys.modules:
        return False
    if not interactiveshell.InteractiveShell.initialized():
        return False
    publisher = getattr(interactiveshell.InteractiveShell.instance(), "display_pub", None)
    if publisher is None:
        return False

    def publish(data: dict[str, Any], metadata: dict[str, Any] | None = None, source: Any = None, *,
                transient: dict[str, Any] | None = None, update: bool = False, **kwargs: Any) -> None:
        display_id = (transient or {}).get("display_id")
        _this_process_notes()
        if WIDGET_VIEW in data or display_id in _widget_display_ids:
            note_widget(data, display_id)
            return
        _send({"op": "display", "data": dict(data), "metadata": dict(metadata or {}),
               "display_id": (transient or {}).get("display_id"), "update": bool(update)})

    def clear_output(wait: bool = False) -> None:
        _send({"op": "clear", "wait": bool(wait)})

    publisher.publish = publish
    publisher.clear_output = clear_output
    return True


def note_widget(data: dict[str, Any], display_id: str | None = None) -> None:
    """Say once per kind that a widget made in this rank cannot show (see the module doc)."""
    _this_process_notes()
    if display_id:
        _widget_display_ids.add(display_id)
    text = str(data.get("text/plain", "") or "")
    kind = text.split("(", 1)[0].strip() or "widget"
    if WIDGET_VIEW not in data or kind in _noted_widget_kinds:
        return
    _noted_widget_kinds.add(kind)
    _flush_text_streams()
    sys.stderr.write(f"[notebook_launch] a widget made in this rank ({kind}) cannot show in the notebook: "
                     "it lives in the rank's process, which has no connection to the notebook's widgets. "
                     "Report from the rank with print(), notebook_launch.progress(...) or progress.log(...), "
                     "or make the widget in the notebook.\n")
    _flush_text_streams()


def _send(payload: protocol.DisplayPayload) -> None:
    """To the calling thread's rank (XLA ranks are threads). What the rank printed before
    the display is flushed first, so the two arrive in order, as in a kernel."""
    writer = protocol.current()
    if writer is None:
        return
    _flush_text_streams()
    try:
        writer.send(protocol.EventKind.DISPLAY, payload)
    except (pickle.PicklingError, TypeError, AttributeError):   # an odd object in the bundle
        log.debug("display payload not picklable; sending its text only", exc_info=True)
        data = payload.get("data") or {}
        writer.send(protocol.EventKind.DISPLAY, {**payload, "data": {"text/plain": str(data.get("text/plain", ""))},
                                       "metadata": {}})


def _flush_text_streams() -> None:
    """What the rank printed before the display comes first, as in a kernel."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            log.debug("flushing %r before a display failed", stream, exc_info=True)
