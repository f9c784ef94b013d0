"""A real JupyterLab and a headless Chromium page on it, for the soak benchmark (item 14).

Started as tests/test_browser_panel.py starts its own: ``jupyter lab`` on 127.0.0.1 with a token
and config folders of its own, Debian's chromium driven by Playwright (no browser download). What
the soak reads from them: the notebook as JupyterLab saves it, the kernel process (psutil), the
page's JS heap through the DevTools protocol, and the kernel messages the page receives over its
websocket (counted by type as they arrive).
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
from typing import Any, Iterator

from .common import free_port

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
TOKEN = "soak-benchmark-token"
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
def jupyterlab(folder: Path, environ: dict[str, str]) -> Iterator[Lab]:
    """A JupyterLab server serving ``folder/root``, its config folders under ``folder``;
    ``environ`` adds to its environment (the kernel inherits it). Ended with its process group."""
    root = folder / "root"
    root.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(folder / "config"), JUPYTER_RUNTIME_DIR=str(folder / "runtime"),
               JUPYTERLAB_SETTINGS_DIR=str(folder / "settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(folder / "workspaces"), **environ)
    jupyter = str(Path(sys.executable).parent / "jupyter")
    subprocess.run([jupyter, "labextension", "disable", "@jupyterlab/apputils-extension:announcements"],
                   env=env, check=True, capture_output=True)
    port, log_path = free_port(), folder / "lab.log"
    with open(log_path, "w") as log:
        server = subprocess.Popen(
            [jupyter, "lab", "--allow-root", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
             f"--IdentityProvider.token={TOKEN}", f"--ServerApp.root_dir={root}",
             "--LabApp.expose_app_in_browser=True"],
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


@contextlib.contextmanager
def chromium_page(lab: Lab) -> Iterator[Any]:
    """A headless Chromium page (the browser test's flags), closed with its browser."""
    from playwright.sync_api import sync_playwright
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run"])
        try:
            yield browser.new_page(viewport={"width": 1500, "height": 1100})
        finally:
            browser.close()


def open_notebook(page: Any, lab: Lab, name: str) -> None:
    """Open ``name`` in JupyterLab and wait for its kernel to be idle."""
    page.goto(f"{lab.base}/lab/tree/{name}?reset&token={lab.token}")
    page.locator(".jp-Notebook .jp-CodeCell").first.wait_for(timeout=120_000)
    page.wait_for_function("window.jupyterapp && window.jupyterapp.commands.hasCommand("
                           "'notebook:run-all-cells')", timeout=60_000)
    page.wait_for_function(
        "() => { const w = window.jupyterapp.shell.currentWidget;"
        " return w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel"
        " && w.sessionContext.session.kernel.status == 'idle'; }", timeout=120_000)


def run_cell(page: Any, index: int) -> None:
    """Run one cell, not waiting for it to end."""
    page.evaluate(f"""() => {{
        const panel = window.jupyterapp.shell.currentWidget;
        panel.content.activeCellIndex = {index};
        window.jupyterapp.commands.execute('notebook:run-cell');
    }}""")


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
