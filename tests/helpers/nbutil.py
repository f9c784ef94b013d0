"""Run notebooks in a real Jupyter kernel of the interpreter running the tests.

The kernelspec lives in a private temporary folder and names ``sys.executable``,
so a ``python3`` kernelspec installed elsewhere on the machine (another Python,
without notebook_launch) can never be picked by mistake. Every kernel made here
listens on ports of this process's own block (``helpers.kernel_ports``: why).
"""
from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import nbformat
from nbclient.exceptions import CellExecutionError  # noqa: F401  (re-exported for tests)

from helpers.kernel_ports import kernel_manager_class

KERNEL_NAME = "notebook-launch-tests"
# How long nbclient waits, after a cell's execute_reply, for the rest of its IOPub output (up to the
# kernel's idle status); what has not come by then is dropped from the cell without an error. Its
# default, 4 s, is less than a loaded machine can take to publish a cell's last few thousand relayed
# lines (test_persistent_notebook's between-calls test lost its tail that way on the Colab lane).
# Only a wait: nbclient returns as soon as idle comes, and output that never comes still fails.
IOPUB_TIMEOUT = 60
_kernel_dir = None


def kernel_spec_dir() -> str:
    """A kernels/ folder holding one kernelspec that runs this interpreter's ipykernel."""
    global _kernel_dir
    if _kernel_dir is None:
        root = Path(tempfile.mkdtemp(prefix="nl-kernels-"))
        spec = root / KERNEL_NAME
        spec.mkdir()
        (spec / "kernel.json").write_text(json.dumps({
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "notebook_launch tests", "language": "python",
        }))
        _kernel_dir = str(root)
    return _kernel_dir


def kernel_manager(kernel_name: str = KERNEL_NAME) -> Any:
    """A (not yet started) manager of a test kernel: this interpreter's (``KERNEL_NAME``, the private
    kernelspec) or an installed one (``python3``), on ports from this process's block."""
    from jupyter_client.kernelspec import KernelSpecManager
    if kernel_name != KERNEL_NAME:   # an installed kernel: found where Jupyter looks
        return kernel_manager_class()(kernel_name=kernel_name)
    specs = KernelSpecManager(kernel_dirs=[kernel_spec_dir()])
    return kernel_manager_class()(kernel_name=KERNEL_NAME, kernel_spec_manager=specs)


def start_kernel(kernel_name: str = KERNEL_NAME, **start: Any) -> tuple[Any, Any]:
    """``jupyter_client.manager.start_new_kernel`` on ports from this process's block
    (``kernel_manager``): the manager and a ready client; ``start``: what ``start_kernel`` takes."""
    km = kernel_manager(kernel_name)
    km.start_kernel(**start)
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=120)
    except RuntimeError:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
        raise
    return km, kc


def run_notebook(path_or_nb, *, cwd=None, timeout: int = 600, allow_errors: bool = False,
                 store_widget_state: bool = True, messages: list | None = None):
    """Execute every cell in a fresh kernel and return the executed notebook (nbformat node).

    ``path_or_nb`` is a notebook file or an nbformat notebook; cells run in ``cwd``
    (default: the notebook's folder, or the current folder). With ``messages``, every
    IOPub message the cells got is appended to it as (cell index, msg_type, content):
    the notebook itself keeps only the result of update_display_data and clear_output.
    """
    from nbclient import NotebookClient

    if isinstance(path_or_nb, (str, Path)):
        nb = nbformat.read(str(path_or_nb), as_version=4)
        cwd = cwd or str(Path(path_or_nb).resolve().parent)
    else:
        nb = path_or_nb
    km = kernel_manager()
    client_class = NotebookClient if messages is None else _recording_client(NotebookClient, messages)
    client = client_class(nb, km=km, timeout=timeout, allow_errors=allow_errors,
                            resources={"metadata": {"path": cwd or "."}},
                            store_widget_state=store_widget_state, iopub_timeout=IOPUB_TIMEOUT)
    try:
        client.execute()
    finally:
        stop_kernel(client, km)
    return nb


def stop_kernel(client, km) -> None:
    """What nbclient leaves undone when it is handed a kernel manager (``owns_km`` is False): it
    stops neither the kernel (and so its ranks) nor its kernel client's channels. A heartbeat
    channel left running reconnects to the dead kernel every second from its own thread,
    opening a new socket each time, which an fd leak check of a later test in this process
    would count as ours.

    The heartbeat channel is stopped apart, with a bounded join: jupyter_client picks the kernel's
    ports by binding port 0 and closing it, and the kernel binds them a second or more later; on a
    busy machine another process could take one in between (the tests' kernels now get ports no one
    else is handed, ``helpers.kernel_ports``; a kernel started another way still can). When that was
    the heartbeat port the kernel ran without a heartbeat ("Address already in use" from its Heartbeat thread) and the
    client's channel, connected to whatever holds the port, can sit in an ``await socket.send``
    that its ``stop()`` never wakes: ``join()`` without a timeout hung the test (seen on
    jupyter_client 7.4.9). The kernel manager, not the heartbeat, tells nbclient whether the kernel
    lives, so a channel stuck that way is left behind as the daemon thread it is: stuck, it opens
    no new sockets."""
    kc = client.kc
    if kc is not None:
        hb = kc._hb_channel
        if hb is not None and hb.is_alive():
            hb._running = False   # what HBChannel.stop() does, with a bounded join
            hb._exit.set()
            hb.join(timeout=10)
            if hb.is_alive():
                kc._hb_channel = None   # stop_channels() would join it forever
            else:
                hb.close()
        kc.stop_channels()
        client.kc = None
    if km.has_kernel:
        km.shutdown_kernel(now=True)


def _recording_client(base, messages: list):
    class RecordingClient(base):
        def process_message(self, msg, cell, cell_index):
            messages.append((cell_index, msg["msg_type"], msg["content"]))
            return super().process_message(msg, cell, cell_index)
    return RecordingClient


def make_notebook(*sources: str):
    """A notebook with one code cell per source string."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in sources]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


notebook_from_cells = make_notebook


def cell_text(cell) -> str:
    """Everything a code cell showed: streams, text/plain results and errors with tracebacks.
    Consecutive outputs of one stream are one text, as a notebook shows them: the kernel sends
    what was written since its last flush, which may end mid-line (a print's words flushed
    apart on a loaded machine once read as two lines)."""
    parts: list[str] = []
    previous = None
    for out in cell.get("outputs", []):
        if out.output_type == "stream":
            if previous is not None and previous.output_type == "stream" and previous.name == out.name and parts:
                parts[-1] += out.text
            else:
                parts.append(out.text)
        elif out.output_type in ("execute_result", "display_data"):
            parts.append(out.get("data", {}).get("text/plain", ""))
        elif out.output_type == "error":
            parts.append(f"{out.ename}: {out.evalue}\n" + "\n".join(out.traceback))
        previous = out
    return "".join(p if p.endswith("\n") else p + "\n" for p in parts if p)


@contextmanager
def running_kernel(cwd: str) -> Iterator[tuple[Any, Any]]:
    """A real kernel of this interpreter and its client, ready; shut down (or cleaned up, when a
    test killed it) on the way out. Yields (kernel manager, client)."""
    km = kernel_manager()
    km.start_kernel(cwd=cwd)
    client = km.client()
    client.start_channels()
    client.wait_for_ready(timeout=120)
    try:
        yield km, client
    finally:
        client.stop_channels()
        if km.has_kernel:
            km.shutdown_kernel(now=True)
        else:
            km.cleanup_resources()
