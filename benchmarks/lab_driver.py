"""A real JupyterLab and a headless Chromium page on it: written once for the three that drive one.

The soak benchmark (item 14, benchmarks/soak.py), the browser tests (tests/test_browser_panel.py) and
the docs' panel pictures (scripts/panel_pictures.py) all start ``jupyter lab`` on 127.0.0.1 with a
token and config folders of their own, drive Debian's chromium with Playwright (no browser download),
open a notebook, run its cells one by one and wait on what the page shows. What the soak alone reads:
the notebook as JupyterLab saves it, the kernel process (psutil), the page's JS heap through the
DevTools protocol, and the kernel messages the page receives over its websocket (counted by type).
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

from .common import free_port

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
TOKEN = "lab-driver-token"
LIVE_BARS = ".jupyter-widgets .nl-bar"           # the widget panel while its run goes (display/rows.py)
PICTURE_BARS = ".nl-panel .nl-bar"                 # its picture once the run ended (display/html.py)
MSG_TYPE = re.compile(rb'"msg_type"\s*:\s*"([a-z_]+)"')


def missing_tools() -> str:
    """Why the soak cannot run here ('' when it can): the browser and the Python packages it drives."""
    if not os.path.exists(CHROMIUM):
        return "needs Debian's chromium (bash scripts/system-packages.sh)"
    for module in ("playwright", "jupyterlab", "psutil", "nbformat"):
        try:
            __import__(module)
        except ImportError:
            return f"needs the {module} package (pip install -e '.[test]')"
    return ""


@dataclass
class Lab:
    """A running JupyterLab server: where to reach it and its process."""
    base: str
    token: str
    root: Path
    log: Path
    server: subprocess.Popen

    def kernel_processes(self) -> list:
        """The server's kernels: its own ipykernel children (forked ranks below them carry the same
        command line, so only the server's direct children count)."""
        import psutil
        found = []
        for child in psutil.Process(self.server.pid).children(recursive=False):
            with contextlib.suppress(psutil.Error):
                if any("ipykernel" in part for part in child.cmdline()):
                    found.append(child)
        return found


@contextlib.contextmanager
def jupyterlab(folder: Path, environ: dict[str, str], notebooks: dict[str, list[str]] | None = None,
               server_args: Sequence[str] = (), port: int | None = None) -> Iterator[Lab]:
    """A JupyterLab server serving ``folder/root``, its config folders under ``folder``;
    ``environ`` adds to its environment (the kernel inherits it); ``notebooks`` (name -> cells' sources)
    are written into the root first; ``server_args`` go on its command line; ``port``: where it listens
    (default: one free now). Ended with its process group."""
    root = folder / "root"
    root.mkdir(parents=True, exist_ok=True)
    for name, cells in (notebooks or {}).items():
        write_notebook(root / name, cells)
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(folder / "config"), JUPYTER_RUNTIME_DIR=str(folder / "runtime"),
               JUPYTERLAB_SETTINGS_DIR=str(folder / "settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(folder / "workspaces"), **environ)
    jupyter = str(Path(sys.executable).parent / "jupyter")
    subprocess.run([jupyter, "labextension", "disable", "@jupyterlab/apputils-extension:announcements"],
                   env=env, check=True, capture_output=True)
    port, log_path = port or free_port(), folder / "lab.log"
    with open(log_path, "w") as log:
        server = subprocess.Popen(
            [jupyter, "lab", "--allow-root", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
             f"--IdentityProvider.token={TOKEN}", f"--ServerApp.root_dir={root}",
             "--LabApp.expose_app_in_browser=True", *server_args],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        lab = Lab(f"http://127.0.0.1:{port}", TOKEN, root, log_path, server)
        try:
            wait_until_up(lab)
            yield lab
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()


def wait_until_up(lab: Lab, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            urllib.request.urlopen(f"{lab.base}/api/status?token={lab.token}", timeout=5)
            return
        except Exception:   # why: not listening yet; the deadline and the log say when it never will
            if lab.server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("jupyter lab did not start:\n" + lab.log.read_text()[-3000:]) from None
            time.sleep(0.5)


@dataclass
class MessageCounter:
    """Kernel messages the page received over its websockets, by msg_type, as they arrive."""
    counts: dict[str, int] = field(default_factory=dict)

    def watch(self, page: Any) -> None:
        page.on("websocket", lambda ws: ws.on("framereceived", self.frame))

    def frame(self, payload: Any) -> None:
        data = payload.encode() if isinstance(payload, str) else bytes(payload)
        found = MSG_TYPE.search(data)   # the header's msg_type comes first (the parent's after it)
        if found:
            kind = found.group(1).decode()
            self.counts[kind] = self.counts.get(kind, 0) + 1

    def total(self, kind: str | None = None) -> int:
        return sum(self.counts.values()) if kind is None else self.counts.get(kind, 0)


def write_notebook(path: Path, cells: list[str]) -> None:
    """A notebook of code cells with the python3 kernel, as a person would have saved it."""
    import nbformat
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in cells]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(path))


@contextlib.contextmanager
def chromium_page(width: int = 1500, height: int = 1100, scale: float | None = None) -> Iterator[Any]:
    """A headless Chromium page (no sandbox, no GPU, nothing fetched in the background), closed with its
    browser. ``scale``: the device scale factor (pictures are taken at 1)."""
    from playwright.sync_api import sync_playwright
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run"])
        try:
            yield browser.new_page(viewport={"width": width, "height": height}, device_scale_factor=scale)
        finally:
            browser.close()


def open_notebook(page: Any, lab: Lab, name: str) -> None:
    """Open ``name`` in JupyterLab and wait for its kernel to be idle."""
    page.goto(f"{lab.base}/lab/tree/{name}?reset&token={lab.token}")
    page.locator(".jp-Notebook .jp-CodeCell").first.wait_for(timeout=120_000)
    page.wait_for_function("window.jupyterapp && window.jupyterapp.commands.hasCommand("
                           "'notebook:run-all-cells')", timeout=60_000)
    wait_kernel_idle(page)


def wait_kernel_idle(page: Any) -> None:
    page.wait_for_function(
        "() => { const w = window.jupyterapp.shell.currentWidget;"
        " return w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel"
        " && w.sessionContext.session.kernel.status == 'idle'; }", timeout=120_000)


def shut_down_kernels(lab: Lab) -> None:
    """Shut the server's kernels down through the REST API, as the server does at exit."""
    import json
    headers = {"Authorization": f"token {lab.token}"}
    with urllib.request.urlopen(urllib.request.Request(f"{lab.base}/api/kernels", headers=headers),
                                timeout=60) as reply:
        kernels = json.load(reply)
    for kernel in kernels:
        urllib.request.urlopen(urllib.request.Request(
            f"{lab.base}/api/kernels/{kernel['id']}", method="DELETE", headers=headers), timeout=120)


def run_cell(page: Any, index: int) -> None:
    """Run one cell, not waiting for it to end (Run All would skip the cells after an expected failure)."""
    page.evaluate(f"""() => {{
        const panel = window.jupyterapp.shell.currentWidget;
        panel.content.activeCellIndex = {index};
        window.jupyterapp.commands.execute('notebook:run-cell');   // not awaited: it resolves at the end
    }}""")


def cell(page: Any, index: int) -> Any:
    return page.locator(".jp-Notebook .jp-CodeCell").nth(index)


def wait_for_text(page: Any, index: int, text: str, timeout_s: float) -> None:
    cell(page, index).locator(".jp-OutputArea").get_by_text(text, exact=False).first.wait_for(
        timeout=timeout_s * 1000)


def wait_for_bars(page: Any, index: int, count: int, each: str, timeout_s: float, selector: str = LIVE_BARS) -> None:
    """Wait until cell ``index`` shows ``count`` bars and ``each`` (JS, of bar ``b``) holds for all."""
    page.wait_for_function(
        f"() => {{ const bars = [...document.querySelectorAll('.jp-CodeCell')][{index}]"
        f".querySelectorAll('{selector}');"
        f" return bars.length == {count} && [...bars].every(b => {each}); }}", timeout=timeout_s * 1000)


def cell_text(page: Any, index: int) -> str:
    return page.evaluate(f"() => [...document.querySelectorAll('.jp-CodeCell')][{index}]"
                         ".querySelector('.jp-OutputArea').innerText")


def save_notebook(page: Any) -> None:
    """JupyterLab saves the notebook as it is now (outputs of the running cell included)."""
    page.evaluate("async () => { await window.jupyterapp.commands.execute('docmanager:save'); }")


def js_heap_bytes(session: Any) -> float:
    """The page's live JS heap: collected first, so a sample is what is still held, not garbage."""
    session.send("HeapProfiler.collectGarbage")
    return float(session.send("Runtime.getHeapUsage")["usedSize"])


def wait_ended(page: Any, index: int, timeout_s: float = 120) -> None:
    """The run of cell ``index`` ended: its panel is static HTML, no widget and no Stop button left."""
    cell(page, index).locator(PICTURE_BARS).first.wait_for(state="attached", timeout=timeout_s * 1000)   # 0% is 0 px
    page.wait_for_function(
        f"() => [...document.querySelectorAll('.jp-CodeCell')][{index}]"
        ".querySelectorAll('.jupyter-widgets, .widget-hprogress, .nl-panel button').length == 0",
        timeout=timeout_s * 1000)
