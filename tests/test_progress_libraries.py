"""The bars users' libraries draw in a rank become panel bars, in a real Jupyter kernel
(issue 25): rich's ``track`` and ``Progress`` (rich believes it runs in Jupyter in a rank
forked from a kernel, and would draw into widgets nobody sees), nested tqdm loops (the
row follows the moving bar, ends on the outer loop), and widgets made in a rank (a clear
note in the cell, once per rank per kind, instead of nothing).

One kernel runs every case, a cell each (a kernel start costs seconds); every case reads
the launch's final RunState (``KEEP_STATES_CELL``) and the cell's outputs."""
import ast
import re

import pytest

pytest.importorskip("nbclient")
pytest.importorskip("rich")
pytest.importorskip("tqdm")
pytest.importorskip("ipywidgets")

from helpers.panel_helpers import KEEP_STATES_CELL

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"

DEFINITIONS = '''
from notebook_launch import notebook_launcher
import rich
rich.print("[bold]rich in the notebook[/bold]")      # the global console exists, made in Jupyter
print("NOTEBOOK_JUPYTER", rich.get_console().is_jupyter)

def rich_loops():
    import time
    import rich
    from rich.console import Console
    from rich.progress import Progress, track
    for _ in track(range(30), description="[green]tracking"):
        time.sleep(0.01)
    with Progress() as bars:
        task = bars.add_task("manual", total=10)
        for _ in range(10):
            bars.advance(task)
        hidden = bars.add_task("hidden", total=5, visible=False)
        bars.update(hidden, advance=5)
    rich.print("RICH_TEXT from a rank")
    return rich.get_console().is_jupyter, Console().is_jupyter

def nested_tqdm():
    from tqdm.auto import tqdm
    for epoch in tqdm(range(3), desc="epoch"):
        for step in tqdm(range(20), desc="step", leave=False):
            pass
    return True

def two_rich_tasks():
    """Two tasks side by side in one rich Progress: the short one is done first, both close when it stops."""
    import time
    from rich.progress import Progress
    with Progress() as bars:
        short = bars.add_task("download", total=10)
        long = bars.add_task("process", total=40)
        for step in range(40):
            if step < 10:
                bars.advance(short)
            bars.advance(long)
            time.sleep(0.01)
    return True

def make_widgets():
    import ipywidgets
    from IPython.display import display
    display(ipywidgets.IntSlider(value=1))
    display(ipywidgets.IntSlider(value=2))
    display(ipywidgets.Button(description="rank button"))
    print("after the widgets")
    return True
'''


def _outputs_text(cell):
    parts = []
    for out in cell.outputs:
        if out.output_type == "stream":
            parts.append(out.text)
        elif out.output_type in ("display_data", "execute_result"):
            parts.append(out.data.get("text/plain", ""))
        elif out.output_type == "error":
            parts.append("\n".join(out.traceback))
    return "\n".join(parts)


def _printed(cell, marker):
    """The Python value printed after ``marker`` in the cell."""
    for line in _outputs_text(cell).splitlines():
        if line.startswith(marker + " "):
            return ast.literal_eval(line[len(marker) + 1:])
    raise AssertionError(f"{marker} not printed: {_outputs_text(cell)}")


@pytest.fixture(scope="module")
def notebook():
    from helpers.nbutil import make_notebook, run_notebook
    cells = [
        KEEP_STATES_CELL,
        DEFINITIONS,
        "print('RESULT', notebook_launcher(rich_loops, num_processes=2, ui=keeping()))\nprint('BARS', bars_of(0))",
        "print('RESULT', notebook_launcher(nested_tqdm, num_processes=2, ui=keeping()))\nprint('BARS', bars_of(1))",
        "print('RESULT', notebook_launcher(make_widgets, num_processes=2, ui=keeping()))",
        "from notebook_launch.display import format as fmt\n"
        "print('RESULT', notebook_launcher(two_rich_tasks, num_processes=2, ui=keeping()))\nprint('BARS', bars_of(0))\n"
        "print('ROWS', [fmt.rank_line(rs) for rs in kept[-1].ranks])",
    ]
    return run_notebook(make_notebook(*cells), timeout=300, allow_errors=True)


def test_rich_in_a_rank_is_not_jupyter_and_its_bars_reach_the_panel(notebook):
    assert "NOTEBOOK_JUPYTER True" in _outputs_text(notebook.cells[1]), "rich is not in Jupyter: proves nothing"
    cell = notebook.cells[2]
    text = _outputs_text(cell)
    # the inherited global console and a new one both draw as plain text in the rank
    assert _printed(cell, "RESULT") == [(False, False), (False, False)], text
    bars, main = _printed(cell, "BARS")
    assert ("tracking", 30, 30, True) in bars, bars        # markup stripped, every step counted
    assert ("manual", 10, 10, True) in bars, bars
    assert not any(desc == "hidden" for desc, *_ in bars), bars   # an invisible task is no bar
    assert main == "tracking"                                # the longest loop, not the last
    # rich's text reaches the cell: both ranks printed it alike, one line names them (display.cell_budget)
    assert re.search(r"\[ranks 0-1\] RICH_TEXT from a rank", text), text


def test_nested_tqdm_bars_end_on_the_outer_loop(notebook):
    cell = notebook.cells[3]
    bars, main = _printed(cell, "BARS")
    assert bars[0] == ("epoch", 3, 3, True), bars
    assert [b for b in bars if b[0] == "step"] and all(b[1:] == (20, 20, True) for b in bars if b[0] == "step")
    assert main == "epoch"


def test_a_widget_made_in_a_rank_is_a_note_once_per_rank_and_kind(notebook):
    cell = notebook.cells[4]
    text = _outputs_text(cell)
    assert "RESULT [True, True]" in text, text
    for rank in (0, 1):   # a line both ranks printed alike shows once, as "[ranks 0-1] ..." (display.cell_budget)
        tag = rf"\[(?:rank {rank}|ranks 0-1)\]"
        notes = re.findall(rf"{tag} \[notebook_launch\] a widget made in this rank \((\w+)\) cannot show", text)
        assert sorted(notes) == ["Button", "IntSlider"], text   # two sliders, one note
        assert re.search(rf"{tag} after the widgets", text), text
    # no view of a model the notebook never had (the panel itself ended as a picture)
    assert [o for o in cell.outputs if o.output_type == "display_data" and WIDGET_VIEW in o.data] == []


def test_two_rich_tasks_side_by_side_both_stay_in_the_final_picture(notebook):
    """Before, the final picture showed the task that finished first and dropped the other (the
    first task counted the second as a loop nested in it). Now the row ends on the task that
    finished last and mentions the other; the cell's final panel shows both."""
    cell = notebook.cells[5]
    text = _outputs_text(cell)
    assert "RESULT [True, True]" in text, text
    bars, main = _printed(cell, "BARS")
    assert ("download", 10, 10, True) in bars and ("process", 40, 40, True) in bars, bars
    assert main == "process", bars
    for row in _printed(cell, "ROWS"):
        assert "process: 100%" in row and "also download 100%" in row, row
    pictures = [o.data.get("text/html", "") + o.data.get("text/plain", "") for o in cell.outputs
                if o.output_type in ("display_data", "update_display_data")]
    final = pictures[-1] if pictures else ""
    assert "process" in final and "download" in final, final
