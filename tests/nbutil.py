"""Run notebooks in a real Jupyter kernel (nbclient) with this venv's python."""
from __future__ import annotations

from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError  # noqa: F401  (re-exported for tests)


def make_notebook(*cells: str):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in cells]
    return nb


def run_notebook(nb, *, timeout=300, allow_errors=False, cwd=None, store_widget_state=True):
    """Execute every cell; the 'python3' kernel resolves to this interpreter (sys.executable).

    ``nb`` is a notebook node or a path to an .ipynb file (then cells run in its folder
    unless ``cwd`` says otherwise); returns the executed notebook.
    """
    if isinstance(nb, (str, Path)):
        cwd = cwd or str(Path(nb).resolve().parent)
        nb = nbformat.read(str(nb), as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=allow_errors,
                            resources={"metadata": {"path": cwd}} if cwd else {},
                            store_widget_state=store_widget_state)
    client.execute()
    return nb


def cell_text(cell) -> str:
    """All text a cell showed: streams, results and error tracebacks."""
    parts = []
    for out in cell.get("outputs", []):
        if out.output_type == "stream":
            parts.append(out.text)
        elif out.output_type in ("execute_result", "display_data"):
            parts.append(out.get("data", {}).get("text/plain", ""))
        elif out.output_type == "error":
            parts.append(f"{out.ename}: {out.evalue}\n" + "\n".join(out.traceback))
    return "".join(parts)
