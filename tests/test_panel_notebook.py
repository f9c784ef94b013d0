"""The widget panel in a real Jupyter kernel (nbclient): the saved widget state
shows every rank's bar at its final value and status."""
import json
import sys

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

TRAIN = '''
from notebook_launch import notebook_launcher, progress

def train(n):
    import os
    for i in progress(range(n), desc="train"):
        if i % 1000 == 0:
            progress.log(loss=1.0 / (i + 1))
    print("rank", os.environ["RANK"], "finished")
    return int(os.environ["RANK"])
'''


def run_notebook(cells, timeout=240):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source) for source in cells]
    client = nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3",
                                     store_widget_state=True, allow_errors=True)
    client.execute()
    return nb


def widget_models(nb):
    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    return state


def outputs_text(cell):
    parts = []
    for out in cell.outputs:
        if out.output_type == "stream":
            parts.append(out.text)
        elif out.output_type in ("display_data", "execute_result"):
            parts.append(out.data.get("text/plain", ""))
        elif out.output_type == "error":
            parts.append("\n".join(out.traceback))
    return "\n".join(parts)


def test_widget_panel_final_state_in_saved_notebook():
    nb = run_notebook([TRAIN, "results = notebook_launcher(train, args=(20000,), num_processes=4)\nresults"])
    cell = nb.cells[1]
    text = outputs_text(cell)
    assert "[0, 1, 2, 3]" in text, text
    # the panel is a widget view whose text/plain is the final summary
    views = [o for o in cell.outputs if o.output_type == "display_data"
             and "application/vnd.jupyter.widget-view+json" in o.data]
    assert len(views) == 1, text
    summary = views[0].data["text/plain"]
    for rank in range(4):
        assert f"rank {rank} [cpu] done train: 100% 20000/20000" in summary, summary
    models = widget_models(nb)
    bars = [m["state"] for m in models.values() if m["model_name"] == "FloatProgressModel"]
    assert len(bars) == 4
    assert all(b["value"] == 1.0 and b["bar_style"] == "success" for b in bars), bars
    rows = [m["state"] for m in models.values() if m["model_name"] == "HBoxModel"
            and "nl-rank" in m["state"].get("_dom_classes", [])]
    assert sorted(tuple(r["_dom_classes"]) for r in rows) == [("nl-rank", "nl-status-done")] * 4
    labels = " ".join(m["state"].get("value", "") for m in models.values() if m["model_name"] == "HTMLModel")
    for rank in range(4):
        assert f"rank {rank}</b>" in labels
    assert "20000/20000" in labels and "loss=" in labels
    # rank lines still reach the cell, tagged
    assert "[rank 2] rank 2 finished" in text


FAILING = '''
def train_fails(n):
    import os
    rank = int(os.environ["RANK"])
    for i in progress(range(n), desc="train"):
        if rank == 1 and i == n // 2:
            raise ValueError("boom at half way")
    return rank
'''


def test_failing_rank_row_is_red_with_its_error():
    nb = run_notebook([TRAIN, FAILING, "notebook_launcher(train_fails, args=(4000,), num_processes=2)"])
    cell = nb.cells[2]
    text = outputs_text(cell)
    assert "LaunchError" in text and "rank 1 failed: ValueError: boom at half way" in text
    models = widget_models(nb)
    rows = [m["state"]["_dom_classes"] for m in models.values() if m["model_name"] == "HBoxModel"
            and "nl-rank" in m["state"].get("_dom_classes", [])]
    assert ["nl-rank", "nl-status-failed"] in rows, rows
    htmls = " ".join(m["state"].get("value", "") for m in models.values() if m["model_name"] == "HTMLModel")
    assert "ValueError: boom at half way" in htmls
    bars = [m["state"] for m in models.values() if m["model_name"] == "FloatProgressModel"]
    assert sorted(b["bar_style"] for b in bars)[0] == "danger"


def test_html_mode_updates_in_place_to_the_final_state():
    nb = run_notebook([TRAIN, "notebook_launcher(train, args=(5000,), num_processes=2, ui='html')"])
    cell = nb.cells[1]
    pages = [o.data["text/html"] for o in cell.outputs
             if o.output_type == "display_data" and "text/html" in o.data]
    assert len(pages) == 1, outputs_text(cell)       # one output, updated through its display id
    assert pages[0].count("nl-status-done") == 2 and pages[0].count("width:100.0%") == 2
    assert "5000/5000" in pages[0]


def test_widget_versions_in_this_kernel_are_reported():
    """Says which ipywidgets/ipykernel the notebook tests above ran against (7.7 lane vs 8.x)."""
    nb = run_notebook(["import ipywidgets, ipykernel; print('VERSIONS', ipywidgets.__version__, "
                       "ipykernel.__version__)"])
    text = outputs_text(nb.cells[0])
    assert "VERSIONS" in text
    import ipywidgets
    assert f"VERSIONS {ipywidgets.__version__}" in text
