"""Issue 43 in a real Jupyter kernel (nbclient): 32 forked ranks leave a grouped final picture with
the failed rank on its own row (part 5), and a notebook saved while a launch runs holds the
panel as it is now, bounded, with no history to replay (part 4); its widgets, once closed, hold
nothing a saved notebook would carry for no one."""
import re

import pytest
from helpers.midrun import executing, saved_now, size, wait_for, widget_states
from helpers.nbutil import cell_text, make_notebook, run_notebook

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"

THIRTY_TWO = '''
from notebook_launch import notebook_launcher

def quick():
    import os
    rank = int(os.environ["RANK"])
    if rank == 13:
        raise ValueError("rank 13 gives up")
    return rank

notebook_launcher(quick, num_processes=32, start_method="fork", ui="widget")
'''


def pictures(cell):
    return [o for o in cell.outputs if o.output_type == "display_data" and "nl-panel" in o.data.get("text/html", "")]


@pytest.mark.timeout(600)
def test_32_ranks_end_as_grouped_rows_with_the_failed_rank_alone():
    nb = run_notebook(make_notebook(THIRTY_TWO), timeout=540, allow_errors=True)
    cell = nb.cells[0]
    text = cell_text(cell)
    assert "rank 13 failed: ValueError: rank 13 gives up" in text, text[-3000:]
    other = text.split("Other ranks:")[1].split("Logs:")[0].strip().splitlines()
    assert 1 <= len(other) <= 3 and all(line.lstrip().startswith(("rank", "ranks")) for line in other), other
    assert not [o for o in cell.outputs if o.output_type == "display_data" and WIDGET_VIEW in o.data]
    [picture] = pictures(cell)
    page = picture.data["text/html"]
    [failed] = re.findall(r"<tr class='nl-rank nl-status-failed'.*?</tr>", page)
    assert "<b>rank 13</b>" in failed and "ValueError: rank 13 gives up" in failed
    groups = re.findall(r"<tr class='nl-group.*?</tr>", page)
    assert groups, page
    alone = re.findall(r"<tr class='nl-rank", page)
    held = sum(int(n) for n in re.findall(r"<small>×(\d+)</small>", page))
    assert held + len(alone) == 32 and len(alone) < 10, (held, len(alone))
    found = re.search(r"<div class='nl-header'.*?</div>", page)
    assert found is not None
    assert "32 ranks" in found[0] and "1 failed" in found[0], found[0]
    summary = picture.data["text/plain"]
    assert "rank 13 [cpu] failed" in summary and len(summary.splitlines()) < 15, summary
    assert page.count("<details class='nl-recent-lines'>") == 1 + len(groups) + len(alone) - 1


LOUD = '''
import os
from notebook_launch import notebook_launcher, progress

def loud(flag):
    import os, time
    rank = int(os.environ["RANK"])
    bar = progress(desc="train")
    step = 0
    while not os.path.exists(flag):
        bar.update(1, loss=1.0 / (step + 1))
        print(f"rank {rank} step {step} " + "y" * 200, flush=True)
        step += 1
        time.sleep(0.01)
    bar.close()
    return rank

notebook_launcher(loud, args=(FLAG,), num_processes=4, ui="widget", cell_output=10_000)
'''


def rows_value(nb):
    """The rows widget's HTML in a saved notebook (its one current value)."""
    found = [s["value"] for s in widget_states(nb).values() if "nl-rows" in str(s.get("value", ""))]
    return found[0] if len(found) == 1 else None


def held_back(nb):
    """How many lines the rolling tail says are only in the log files, or 0 (no tail yet)."""
    for out in nb.cells[0].outputs:
        text = out.get("data", {}).get("text/plain", "")
        match = re.search(r"([\d,]+) more lines \(.*?\) are only in the log files", text)
        if match:
            return int(match[1].replace(",", ""))
    return 0


@pytest.mark.timeout(600)
def test_a_notebook_saved_mid_run_holds_the_panel_as_it_is_now(tmp_path):
    flag = tmp_path / "stop-now"
    nb = make_notebook(LOUD.replace("FLAG", repr(str(flag))))
    saved = []
    with executing(nb, str(tmp_path), timeout=540) as client:
        try:
            first = wait_for("the rolling tail", lambda: (lambda n: n if held_back(n) and rows_value(n) else None)(
                saved_now(client)))
            saved.append(first)
            saved.append(wait_for("twice as many lines held back", lambda: (
                lambda n: n if held_back(n) > 2 * held_back(first) + 200 else None)(saved_now(client))))
        finally:
            flag.write_text("")
    assert client.error is None, client.error
    for n, nb_then in enumerate(saved):
        path = tmp_path / f"saved{n}.ipynb"
        nbformat.write(nb_then, str(path))
        reopened = nbformat.read(str(path), as_version=4)
        outputs = reopened.cells[0].outputs
        views = [o for o in outputs if o.output_type == "display_data" and WIDGET_VIEW in o.data]
        assert len(views) == 1                                   # the live panel, once
        assert size(outputs) < 40_000, size(outputs)            # cell_output=10_000, the tail, the panel's view
        states = widget_states(reopened)
        assert size(states) < 100_000, size(states)
        rows = rows_value(reopened)
        assert rows.count("<tr class='nl-rank") == 4             # the rows as they were then, once
    assert len(widget_states(saved[0])) == len(widget_states(saved[1]))   # no model added as the run went on
    steps = [max(int(s) for s in re.findall(r"train (\d+) ", re.sub(r"<[^>]+>", "", rows_value(n)))) for n in saved]
    assert steps[1] > steps[0]
    final = client.nb
    client.set_widgets_metadata()
    assert not [o for o in final.cells[0].outputs if o.output_type == "display_data" and WIDGET_VIEW in o.data]
    assert len(pictures(final.cells[0])) == 1
    leftover = [s.get("value", "") for s in widget_states(final).values()]
    assert not [v for v in leftover if "nl-rows" in str(v) or "<svg" in str(v)], "closed widgets still hold the panel"
