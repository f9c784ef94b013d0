"""Inside a rank forked from a Jupyter kernel: IPython's display() reaches the notebook.

A forked rank inherits the kernel's IPython shell, so ``display()``,
``update_display``, ``DisplayHandle.update`` and ``clear_output`` (and what
uses them, such as the Transformers Trainer's notebook progress) all call the
shell's display publisher. That publisher sends
on the kernel's zmq socket, which ipykernel refuses from a forked process
("attempted to send message from fork"), so the output would be lost. Here
the publisher sends each call over the rank's event pipe instead; the
notebook re-publishes it (``display.rank_displays``), so it appears in the cell.
"""
from __future__ import annotations

import logging
import pickle
import sys
from typing import Any

from .. import protocol

log = logging.getLogger("notebook_launch")


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
        _send({"op": "display", "data": dict(data), "metadata": dict(metadata or {}),
               "display_id": (transient or {}).get("display_id"), "update": bool(update)})

    def clear_output(wait: bool = False) -> None:
        _send({"op": "clear", "wait": bool(wait)})

    publisher.publish = publish
    publisher.clear_output = clear_output
    return True


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
