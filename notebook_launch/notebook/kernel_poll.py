"""Let the panel's own widgets (the Stop button) receive clicks while the cell runs.

While ``notebook_launcher`` runs, the kernel's main thread is busy, so comm
messages from the browser wait in the shell channel. Two ways to get ours:

- ipykernel >= 7 with subshells: the shell-channel thread asks each comm where
  to route its messages (``_reply_subshell_for``). We create a private subshell
  (its own thread and event loop) and route only our widgets' comms there;
  nothing else in the kernel's queue is touched, so later cells run as usual.
- ipykernel 6 (Colab): ``do_one_iteration`` semantics -- flush the shell stream
  into the kernel's message queue, handle comm messages addressed to our
  widgets, and put every other message back, in order, untouched.

The click handler runs on the subshell thread (ipykernel 7) and only sets a
flag; the supervisor's thread reads it in ``refresh``. Where neither works,
``mode`` is None and the panel says to use the kernel's interrupt.
"""
from __future__ import annotations

import logging
import queue
import threading
from typing import Any, Callable

from ..errors.best_effort import best_effort
from ..errors.ipython_shell import running_kernel

log = logging.getLogger("notebook_launch")


def _kernel() -> Any:
    return running_kernel()   # None: no kernel here, the Stop button cannot be polled


class CommPoller:
    def __init__(self) -> None:
        self.kernel = _kernel()
        self.comm_ids: set[str] = set()
        self.comms: list[Any] = []
        self.subshell_id: Any = None
        self.mode = self._pick_mode()

    def _pick_mode(self) -> str | None:
        kernel = self.kernel
        if kernel is None:
            return None
        channel_thread = getattr(kernel, "shell_channel_thread", None)
        if channel_thread is not None:
            try:
                from ipykernel.comm.comm import BaseComm
            except ImportError:
                log.debug("ipykernel's comm module is missing: no Stop button polling")
                return None
            return "subshell" if hasattr(BaseComm, "_reply_subshell_for") else None
        if getattr(kernel, "shell_stream", None) is not None and hasattr(kernel, "msg_queue"):
            return "queue"
        return None

    def prepare(self) -> None:
        """Make the private subshell now (ipykernel 7), so that ``watch`` routes a widget at once,
        before the browser can have seen it."""
        if self.mode == "subshell" and self.subshell_id is None:
            self.subshell_id = self._create_subshell()
            if self.subshell_id is None:
                self.mode = None

    def watch(self, widget: Any) -> bool:
        """Deliver ``widget``'s messages from the browser during the run; False if impossible."""
        if self.mode is None:
            return False
        comm = getattr(widget, "comm", None)
        if comm is None:
            return False
        if self.mode == "subshell":
            if self.subshell_id is None:
                self.subshell_id = self._create_subshell()
                if self.subshell_id is None:
                    self.mode = None
                    return False
            subshell_id = self.subshell_id
            comm._reply_subshell_for = lambda data, default: subshell_id
        self.comms.append(comm)
        self.comm_ids.add(comm.comm_id)
        return True

    # --- ipykernel 7: a private subshell --------------------------------------
    def _on_channel_thread(self, function: Callable[[Any], Any], timeout: float = 5.0) -> Any:
        """Run ``function`` on the shell-channel thread (where subshells are managed)."""
        thread = self.kernel.shell_channel_thread
        answer: queue.Queue[tuple[bool, Any]] = queue.Queue()

        def call() -> None:
            try:
                answer.put((True, function(thread.manager)))
            except BaseException as exc:  # noqa: BLE001  # why: reported to the caller
                answer.put((False, exc))

        thread.io_loop.add_callback(call)
        ok, value = answer.get(timeout=timeout)
        if not ok:
            raise value
        return value

    def _create_subshell(self) -> Any:
        try:
            return self._on_channel_thread(lambda manager: manager._create_subshell())
        except Exception:   # why: polling is an extra: without a subshell Stop is not polled
            log.debug("creating a kernel subshell failed: no Stop button polling", exc_info=True)
            return None

    # --- ipykernel 6: the kernel's message queue --------------------------------
    def poll(self) -> None:
        """Handle pending messages for our widgets (ipykernel 6; ipykernel 7 needs nothing)."""
        if self.mode != "queue" or not self.comm_ids:
            return
        if threading.current_thread() is not threading.main_thread():
            return
        kernel = self.kernel
        try:
            kernel.shell_stream.flush()
            pending = []
            while True:
                try:
                    pending.append(kernel.msg_queue.get_nowait())
                except Exception:   # why: the queue is empty: tornado's or asyncio's QueueEmpty
                    break
            for item in pending:
                if not self._handle_if_ours(item):
                    kernel.msg_queue.put_nowait(item)
        except Exception:   # why: never risk the kernel's own messages: stop polling
            log.debug("polling the kernel's message queue failed; polling stops", exc_info=True)
            self.mode = None

    def _handle_if_ours(self, item: Any) -> bool:
        kernel = self.kernel
        session = kernel.session
        try:
            _, _, args = item
            raw = args[-1]
            idents, frames = session.feed_identities(raw, copy=False)
            # Peek at header and content WITHOUT Session.deserialize: it records each
            # signature, and the kernel would later reject a message we put back as a
            # "Duplicate Signature".
            header = session.unpack(_frame_bytes(frames[1]))
            if header.get("msg_type") != "comm_msg":
                return False
            content = session.unpack(_frame_bytes(frames[4]))
        except Exception:   # why: a message we cannot read is the kernel's: it is left for the kernel
            log.debug("a kernel message could not be peeked at; left for the kernel", exc_info=True)
            return False
        comm_id = content.get("comm_id")
        if comm_id not in self.comm_ids:
            return False
        try:
            msg = session.deserialize(frames, content=True, copy=False)   # ours: consume it
        except Exception:   # why: a malformed click is dropped, never the run
            log.debug("a Stop button message could not be decoded; dropped", exc_info=True)
            return True
        saved = (getattr(kernel, "_parent_ident", None),
                 kernel.get_parent() if hasattr(kernel, "get_parent") else None)
        try:
            comm = kernel.comm_manager.get_comm(comm_id)
            if comm is not None:
                comm.handle_msg(msg)
        finally:
            if saved[1] is not None:   # keep output going to the running cell
                with best_effort("could not restore the kernel's parent message"):
                    kernel.set_parent(*saved)
        return True

    def close(self) -> None:
        for comm in self.comms:   # route this comm the normal way again
            comm.__dict__.pop("_reply_subshell_for", None)
        if self.mode == "subshell" and self.subshell_id is not None:
            subshell_id, self.subshell_id = self.subshell_id, None
            with best_effort("deleting our kernel subshell failed"):
                self._on_channel_thread(lambda manager: manager._delete_subshell(subshell_id))


def _frame_bytes(frame: Any) -> bytes:
    return frame.bytes if hasattr(frame, "bytes") else bytes(frame)
