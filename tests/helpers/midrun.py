"""A notebook executed in a real kernel (nbclient) on a thread of its own, so a test can save it
while a cell still runs, as a user's Save does mid-run: the outputs so far, the widgets' state now."""
from __future__ import annotations

import copy
import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from helpers.nbutil import IOPUB_TIMEOUT, kernel_manager, stop_kernel

WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


@contextmanager
def executing(nb: Any, cwd: str, timeout: int = 600) -> Iterator[Any]:
    """Yields the nbclient client while its cells run on a thread; on the way out waits for them
    (the test has let the run end) and stops the kernel. ``client.error`` holds what execute raised."""
    from nbclient import NotebookClient
    km = kernel_manager()
    client = NotebookClient(nb, km=km, timeout=timeout, allow_errors=True, resources={"metadata": {"path": cwd}},
                            store_widget_state=True, iopub_timeout=IOPUB_TIMEOUT)
    client.error = None   # type: ignore[attr-defined]  # what execute raised, for the test

    def run() -> None:
        try:
            client.execute()
        except BaseException as exc:  # noqa: BLE001  # why: the test reads it
            client.error = exc   # type: ignore[attr-defined]

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield client
    finally:
        thread.join(timeout)
        stop_kernel(client, km)


def saved_now(client: Any) -> Any:
    """The notebook as a Save now would write it: its outputs so far and the widgets' state (a copy;
    the client's thread goes on changing its own, so a copy that met a change is taken again)."""
    for _ in range(100):
        try:
            client.set_widgets_metadata()
            return copy.deepcopy(client.nb)
        except RuntimeError:   # a dict changed size while copied: the next try
            time.sleep(0.01)
    raise AssertionError("the notebook never held still long enough to be copied")


def widget_states(nb: Any) -> dict[str, dict[str, Any]]:
    """model id -> its saved state."""
    return {model: entry["state"] for model, entry in
            nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {}).items()}


def size(value: Any) -> int:
    return len(json.dumps(value))


def wait_for(what: str, check: Callable[[], Any], timeout: float = 300) -> Any:
    """Poll ``check`` until it returns something true (a condition, never a fixed sleep)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"waited {timeout} s for {what}")
