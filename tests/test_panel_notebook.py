"""The widget panel in a real Jupyter kernel (nbclient): while a run goes the panel is live
widgets; when it ends its output is replaced in place by static HTML of the final panel
(every rank's bar at its final value, statuses, curves, the error row), its widgets closed.
The kernel runs this interpreter (tests/helpers/nbutil.py), so the Colab and Kaggle lanes check
IPython 7.34 / ipykernel 6.17 with ipywidgets 7.7.1 and 8.1.5."""
import re

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"

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


def run_notebook(cells, timeout=240, messages=None):
    from helpers.nbutil import make_notebook
    from helpers.nbutil import run_notebook as run
    return run(make_notebook(*cells), timeout=timeout, allow_errors=True, messages=messages)


def widget_views(cell):
    return [o for o in cell.outputs if o.output_type == "display_data" and WIDGET_VIEW in o.data]


def pictures(cell):
    """The panels that ended as static HTML (html.render's root has class nl-panel)."""
    return [o for o in cell.outputs if o.output_type == "display_data"
            and "nl-panel" in o.data.get("text/html", "")]


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


def printed(cell):
    """What the cell's code printed: its stdout stream as one text. A print can reach the kernel's
    IOPub in more than one message, and any other output between them (which one was not seen)
    makes them separate outputs; joined by outputs_text, "EACH [(0, 0)]" read "EACH\\n [(0, 0)]"."""
    return "".join(out.text for out in cell.outputs if out.output_type == "stream" and out.name == "stdout")


def test_widget_panel_ends_as_a_picture_of_its_final_state():
    nb = run_notebook([TRAIN, "results = notebook_launcher(train, args=(20000,), num_processes=4)\nresults"])
    cell = nb.cells[1]
    text = outputs_text(cell)
    assert "[0, 1, 2, 3]" in text, text
    assert "display widget" in text                     # it ran as the live widget panel
    # the panel's output is now static HTML, its text/plain the final summary; no widget view is left
    assert widget_views(cell) == [], text
    [picture] = pictures(cell)
    summary = picture.data["text/plain"]
    for rank in range(4):
        assert f"rank {rank} [cpu] done train: 100% 20000/20000" in summary, summary
    page = picture.data["text/html"]
    assert page.count("nl-status-done") == 4 and page.count("width:100.0%") == 4
    for rank in range(4):
        assert f"<b>rank {rank}</b>" in page
    assert re.sub(r"<[^>]+>", "", page).count("train 100% 20000/20000") == 4 and "loss=" in page
    assert "<svg" in page and "data-metric='loss'" in page      # the curves, as inline SVG
    assert "Stop" not in page and "<button" not in page        # nothing left to stop
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
    assert widget_views(cell) == []
    [picture] = pictures(cell)
    page = picture.data["text/html"]
    assert re.search(r"<tr class='nl-rank nl-status-failed' style='background:#fee2e2'>.*"
                     r"ValueError: boom at half way", page), page
    assert "failed" in picture.data["text/plain"]


def test_html_mode_updates_in_place_to_the_final_state():
    nb = run_notebook([TRAIN, "notebook_launcher(train, args=(5000,), num_processes=2, ui='html')"])
    cell = nb.cells[1]
    pages = [o.data["text/html"] for o in cell.outputs
             if o.output_type == "display_data" and "text/html" in o.data]
    assert len(pages) == 1, outputs_text(cell)       # one output, updated through its display id
    assert pages[0].count("nl-status-done") == 2 and pages[0].count("width:100.0%") == 2
    assert "5000/5000" in pages[0]


LOOP = 100

COUNTS = '''
from notebook_launch import notebook_launcher, start_ranks
from notebook_launch.planning.net import free_port

def quick(i):
    return i

def lasting(i):
    """A call that outlasts the call panel's delay (display/deferred.py): its panel is drawn."""
    import time
    from notebook_launch.display.deferred import PANEL_AFTER
    time.sleep(PANEL_AFTER + 1.0)
    return i

def open_comms():
    """The kernel's open comms: ipykernel 6.17 keeps them on its comm manager, newer ipykernel
    through the comm package (whose manager is the kernel's)."""
    manager = getattr(get_ipython().kernel, "comm_manager", None)
    if manager is None:
        import comm
        manager = comm.get_comm_manager()
    return len(manager.comms)

def live_widgets():
    from ipywidgets.widgets import widget
    registry = getattr(widget, "_instances", None)
    return len(registry if registry is not None else widget.Widget.widgets)

print("BEFORE", open_comms(), live_widgets())
'''


@pytest.mark.timeout(900)
def test_a_loop_of_launches_leaves_no_live_widget_behind():
    """100 launches in one cell and 2 that last, then calls on persistent ranks: the kernel's count
    of open comms and of live widgets is the same after each launch and call as before the first,
    every widget the kernel opened was closed (IOPub's comm_open/comm_close), and the saved
    notebook holds one picture per launch and lasting call and no widget view. Launches and calls
    over at once build no live panel (display/deferred.py: not one comm opened): a launch leaves
    its picture alone, a call nothing; those that last draw the panel, which becomes the picture."""
    messages: list[tuple[int, str, dict]] = []   # (cell index, msg_type, content) of each IOPub message
    nb = run_notebook([
        COUNTS,
        f"after_each = set()\nfor i in range({LOOP}):\n"
        "    assert notebook_launcher(quick, args=(i,), num_processes=1, ui='widget') == [i]\n"
        "    after_each.add((open_comms(), live_widgets()))\n"
        "for i in range(2):\n"
        "    assert notebook_launcher(lasting, args=(i,), num_processes=1, ui='widget') == [i]\n"
        "    after_each.add((open_comms(), live_widgets()))\n"
        "print('EACH', sorted(after_each))",
        "ranks = start_ranks(2, ui='widget', use_port=free_port())\n"
        "for i in range(5):\n"
        "    assert ranks.run(quick, args=(i,)) == [i, i]\n"
        "    after_each.add((open_comms(), live_widgets()))\n"
        "print('EACH', sorted(after_each))",
        "for i in range(2):\n"
        "    assert ranks.run(lasting, args=(i,)) == [i, i]\n"
        "    after_each.add((open_comms(), live_widgets()))\n"
        "ranks.close()\nprint('EACH', sorted(after_each))",
    ], timeout=600, messages=messages)
    errors = [o for cell in nb.cells for o in cell.outputs if o.output_type == "error"]
    assert not errors, "\n".join(errors[0].traceback)
    before = re.search(r"BEFORE (\d+) (\d+)", printed(nb.cells[0]))
    assert before, outputs_text(nb.cells[0])[-2000:]
    expected = [(int(before[1]), int(before[2]))]
    for index in (1, 2, 3):
        assert f"EACH {expected}" in printed(nb.cells[index]), outputs_text(nb.cells[index])[-2000:]
    opened = [m[2]["comm_id"] for m in messages if m[1] == "comm_open"]
    closed = [m[2]["comm_id"] for m in messages if m[1] == "comm_close"]
    assert len(opened) >= 20 * 4 and sorted(opened) == sorted(closed)   # every model closed, once
    # the quick launches opened none: the cell's comms are the two lasting launches' panels
    assert 20 * 2 <= len([m for m in messages if m[0] == 1 and m[1] == "comm_open"]) <= 100 * 2
    assert not [m for m in messages if m[0] == 2 and m[1] == "comm_open"]   # the quick calls: no panel
    assert all(widget_views(cell) == [] for cell in nb.cells[1:4])
    assert [len(pictures(cell)) for cell in nb.cells[1:4]] == [LOOP + 2, 0, 2]
    assert all("nl-status-done" in p.data["text/html"] for cell in nb.cells[1:4] for p in pictures(cell))


@pytest.mark.timeout(600)
def test_a_call_draws_its_panel_once_there_is_something_to_watch():
    """Issue 45: a call's panel (widget or HTML) is drawn when the call still runs after
    PANEL_AFTER, when a rank prints, or when the call fails; a call over at once that went
    well leaves no output but its value (its panel was 33 widgets and ~75 comm messages: 32 ms
    of a 0.4 ms call in a kernel)."""
    messages: list[tuple[int, str, dict]] = []
    nb = run_notebook([
        COUNTS + "\ndef printing(i):\n    print('LINE', i)\n    return i\n"
        "def failing():\n    raise ValueError('bad batch')\n",
        "ranks = start_ranks(2, ui='widget', use_port=free_port())",
        "ranks.run(quick, args=(3,))",             # 2: over at once: only its value
        "ranks.run(printing, args=(4,))",          # 3: a line: the panel, above its lines
        "ranks.run(lasting, args=(5,))",           # 4: lasts: the panel
        "ranks.run(failing)",                      # 5: fails at once: the failed panel's picture
        "html = start_ranks(2, ui='html', use_port=free_port())\nhtml.run(quick, args=(6,))",   # 6
        "html.run(lasting, args=(7,))",            # 7
        "ranks.close(); html.close()",
    ], timeout=600, messages=messages)
    cells = nb.cells
    quick_call = cells[2]
    assert [o.output_type for o in quick_call.outputs] == ["execute_result"], quick_call.outputs
    assert quick_call.outputs[0]["data"]["text/plain"] == "[3, 3]"
    assert not [m for m in messages if m[0] == 2 and m[1] in ("comm_open", "display_data")]
    assert len(pictures(cells[3])) == 1 and "LINE 4" in printed(cells[3])
    first = [o.output_type for o in cells[3].outputs]
    assert first.index("display_data") < first.index("stream"), first   # the panel above the lines
    assert len(pictures(cells[4])) == 1 and "nl-status-done" in pictures(cells[4])[0].data["text/html"]
    failed = pictures(cells[5])
    assert len(failed) == 1 and "nl-status-failed" in failed[0].data["text/html"], cells[5].outputs
    assert [o for o in cells[5].outputs if o.output_type == "error"][0].ename == "LaunchError"
    assert [o.output_type for o in cells[6].outputs][-1:] == ["execute_result"]
    assert not pictures(cells[6]), cells[6].outputs   # the HTML panel waits as the widget does
    assert len(pictures(cells[7])) == 1, cells[7].outputs
    assert not [o for cell in cells for o in cell.outputs if o.output_type == "error"
                and o.ename != "LaunchError"]


@pytest.mark.timeout(600)
def test_a_launch_draws_its_live_panel_once_there_is_something_to_watch():
    """A launch over before PANEL_AFTER builds no live panel (a trivial launch spent 30-40 ms of a
    kernel's time on 33 widgets nobody could watch): it leaves the same picture the live panel
    would have become, failed ones too; a rank's line or display() draws the panel first, above it."""
    messages: list[tuple[int, str, dict]] = []
    nb = run_notebook([
        COUNTS + "\ndef printing(i):\n    print('LINE', i)\n    return i\n"
        "def showing(i):\n    from IPython.display import display\n    display('SHOWN')\n    return i\n"
        "def failing():\n    raise ValueError('bad batch')\n",
        "notebook_launcher(quick, args=(1,), num_processes=2, ui='widget')",      # 1: over at once
        "notebook_launcher(printing, args=(2,), num_processes=2, ui='widget')",   # 2: a line: the panel
        "notebook_launcher(showing, args=(3,), num_processes=1, ui='widget')",    # 3: a display(): the panel
        "notebook_launcher(failing, num_processes=2, ui='widget')",               # 4: fails at once
        "notebook_launcher(quick, args=(5,), num_processes=2, ui='html')",        # 5: the HTML panel waits too
        "notebook_launcher(lasting, args=(6,), num_processes=1, ui='widget')",    # 6: lasts: the panel
    ], timeout=600, messages=messages)
    cells = nb.cells

    def opened(index):
        return [m for m in messages if m[0] == index and m[1] == "comm_open"]

    quick = cells[1]
    assert not opened(1) and widget_views(quick) == []
    [picture] = pictures(quick)
    assert picture.data["text/html"].count("nl-status-done") == 2 and "2 ranks" in picture.data["text/plain"]
    assert quick.outputs[-1].output_type == "execute_result" and quick.outputs[-1]["data"]["text/plain"] == "[1, 1]"
    assert opened(2) and len(pictures(cells[2])) == 1 and "LINE 2" in printed(cells[2])
    outputs = cells[2].outputs
    line = [i for i, o in enumerate(outputs) if o.output_type == "stream" and "LINE 2" in o.text]
    panel = [i for i, o in enumerate(outputs) if o.output_type == "display_data"]
    assert line and panel and panel[0] < line[0], outputs   # the panel above the rank's lines
    assert opened(3) and len(pictures(cells[3])) == 1
    shown = [i for i, o in enumerate(cells[3].outputs) if o.output_type == "display_data"
             and "SHOWN" in o.data.get("text/plain", "")]
    panel = [i for i, o in enumerate(cells[3].outputs) if o in pictures(cells[3])]
    assert shown and panel and panel[0] < shown[0], cells[3].outputs   # the panel above the rank's output
    assert not opened(4)
    failed = pictures(cells[4])
    assert len(failed) == 1 and "nl-status-failed" in failed[0].data["text/html"], cells[4].outputs
    assert "ValueError: bad batch" in failed[0].data["text/html"]
    assert [o for o in cells[4].outputs if o.output_type == "error"][0].ename == "LaunchError"
    assert len(pictures(cells[5])) == 1 and not opened(5)
    assert opened(6) and len(pictures(cells[6])) == 1 and widget_views(cells[6]) == []
    assert all(widget_views(cell) == [] for cell in cells)


def test_widget_versions_in_this_kernel_are_reported():
    """Says which ipywidgets/ipykernel the notebook tests above ran against (7.7 lane vs 8.x)."""
    nb = run_notebook(["import ipywidgets, ipykernel; print('VERSIONS', ipywidgets.__version__, "
                       "ipykernel.__version__)"])
    text = outputs_text(nb.cells[0])
    assert "VERSIONS" in text
    import ipywidgets
    assert f"VERSIONS {ipywidgets.__version__}" in text
