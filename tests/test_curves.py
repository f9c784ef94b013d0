"""Logged metrics as curves: the bounded summary, every point in metrics.jsonl,
load_metrics, and the curves in each display (widget state read in a real kernel)."""
import io
import json
import math

import pytest
from helpers.panel_helpers import KeepStateDisplay

from notebook_launch import load_metrics, notebook_launcher, progress
from notebook_launch.record.metrics import CAPACITY, METRICS_FILE, MetricsFile, Series
from notebook_launch.display import format as fmt
from notebook_launch.display import html as html_display
from notebook_launch.display.curves import curves_html, sparkline
from notebook_launch.display.rich_panel import RichDisplay
from notebook_launch.record.state import RankState, RunState


def test_a_million_points_cost_at_most_a_thousand_and_keep_min_max_mean():
    series = Series()
    values = [math.sin(i / 50_000) + (5.0 if i == 777_777 else 0.0) for i in range(1_000_000)]
    for start in range(0, len(values), 997):   # events bring uneven chunks
        series.extend(values[start:start + 997])
    assert series.total == 1_000_000
    assert len(series) <= 1000 and len(series) <= CAPACITY
    assert max(series.maxs) == max(values)            # the one spike survives every merge
    assert min(series.mins) == min(values)
    assert sum(series.counts) == 1_000_000
    assert math.isclose(sum(series.sums), sum(values), rel_tol=1e-9)
    points = series.points()
    assert points[0][0] < points[-1][0] and points[-1][0] < 1_000_000
    # bucket k holds points [k * width, (k + 1) * width): its mean is theirs
    k = 100
    chunk = values[k * series.width:(k + 1) * series.width]
    assert math.isclose(points[k][1], sum(chunk) / len(chunk), rel_tol=1e-9)


def test_one_by_one_equals_in_chunks_and_nan_is_a_step_without_a_value():
    a, b = Series(), Series()
    values = [float(i % 7) for i in range(5000)] + [float("nan")] + [1.0]
    for v in values:
        a.add(v)
    b.extend(values)
    assert (a.counts, a.sums, a.mins, a.maxs, a.total) == (b.counts, b.sums, b.mins, b.maxs, b.total)
    assert a.total == 5002 and sum(a.counts) == 5001


def test_sparkline_shows_the_shape_and_a_constant_is_flat():
    falling = Series()
    falling.extend([1.0 / (i + 1) for i in range(1000)])
    line = sparkline(falling)
    assert len(line) == 12 and line[0] == "█" and line[-1] == "▁"
    constant = Series()
    constant.extend([0.1] * 3000)    # means differ from 0.1 only by rounding
    assert set(sparkline(constant)) == {"▁"}


def _state_with_curves():
    state = RunState(run_id="r1", world_size=2, backend="fork", log_dir="/tmp/r1",
                     ranks=[RankState(rank=i, local_rank=i) for i in range(2)])
    for local in range(2):
        state.on_progress(local, {"bars": {}, "metrics": {"loss": 0.5, "lr": 0.1, "note": "x"},
                                  "series": {"loss": [1.0 / (i + 1) + local for i in range(300)],
                                             "lr": [0.1] * 300, "step": list(range(300))}})
    return state


def test_html_display_and_text_summary_show_the_curves():
    state = _state_with_curves()
    page = html_display.render(state)
    assert page.count("<svg") == 2                       # loss and lr; "note" is a string
    assert "nl-curve-rank0" in page and "nl-curve-rank1" in page
    assert "data-metric='loss'" in page and "data-metric='note'" not in page
    assert "data-metric='step'" not in page                # a counter: in the file, not charted
    assert curves_html(state) in page
    summary = fmt.summary(state)
    assert "loss=0.5 █" in summary and "▁" in summary, summary
    from rich.console import Console
    out = io.StringIO()
    rich = RichDisplay(console=Console(file=out, width=200, force_terminal=False, color_system=None))
    rich.start(state)
    rich.close(state)
    assert "loss=0.5 █" in out.getvalue(), out.getvalue()


def test_metrics_file_roundtrip_with_and_without_pandas(tmp_path):
    f = MetricsFile(tmp_path)
    f.write(0, {"loss": [1.0, 0.5, float("nan")], "step": [0, 1, 2]})
    f.write(1, {"loss": [2.0]})
    f.write(0, {"loss": [0.25]})
    f.close()
    rows = [json.loads(line) for line in (tmp_path / METRICS_FILE).read_text().splitlines()]
    assert rows[0] == {"rank": 0, "metric": "loss", "step": 0, "value": 1.0}
    plain = load_metrics(tmp_path, pandas=False)
    assert plain["rank"] == [0, 0, 0, 0, 0, 0, 1, 0]
    assert plain["step"][-1] == 3 and plain["value"][-1] == 0.25   # steps continue per rank and metric
    assert math.isnan(plain["value"][2])
    pd = pytest.importorskip("pandas")
    frame = load_metrics(tmp_path)
    assert isinstance(frame, pd.DataFrame) and list(frame.columns) == ["rank", "metric", "step", "value"]
    assert len(frame) == 8


def test_load_metrics_names_a_wrong_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="run folder"):
        load_metrics(tmp_path / "nope")
    assert load_metrics(tmp_path, pandas=False) == {"rank": [], "metric": [], "step": [], "value": []}


def _logs_every_step(n):
    import os
    rank = int(os.environ["RANK"])
    bar = progress(range(n), desc="train")
    for i in bar:
        progress.log(loss=1.0 / (i + 1) + rank)
        if i % 3 == 0:
            bar.set_postfix(acc=i / n, phase="warmup")
    return n


def test_every_logged_point_reaches_the_run_folder_though_events_are_batched(tmp_path):
    n = 100_000
    display = KeepStateDisplay()
    notebook_launcher(_logs_every_step, args=(n,), num_processes=2, log_dir=str(tmp_path), ui=display)
    state = display.state
    plain = load_metrics(tmp_path, pandas=False)
    for rank in range(2):
        losses = [(s, v) for r, m, s, v in zip(plain["rank"], plain["metric"], plain["step"], plain["value"])
                  if r == rank and m == "loss"]
        assert [s for s, _ in losses] == list(range(n))
        assert [v for _, v in losses] == [1.0 / (i + 1) + rank for i in range(n)]   # in logging order
        accs = [v for r, m, v in zip(plain["rank"], plain["metric"], plain["value"]) if r == rank and m == "acc"]
        assert len(accs) == len(range(0, n, 3))
        rs = state.ranks[rank]
        assert rs.curves["loss"].total == n and len(rs.curves["loss"]) <= CAPACITY
        assert "phase" not in rs.curves and rs.metrics["phase"] == "warmup"
    assert "phase" not in plain["metric"]


def test_widget_panel_ends_with_the_curves_after_a_run_in_a_kernel():
    pytest.importorskip("nbclient")
    from helpers.nbutil import cell_text, make_notebook, run_notebook
    nb = run_notebook(make_notebook(
        "from notebook_launch import notebook_launcher, progress, load_metrics",
        '''def train(n):
    import os
    rank = int(os.environ["RANK"])
    for i in progress(range(n), desc="train"):
        progress.log(loss=1.0 / (i + 1) + rank, lr=0.01)
    return rank''',
        "results = notebook_launcher(train, args=(5000,), num_processes=2, ui='widget')",
        "frame = load_metrics()\nprint('ROWS', len(frame), sorted(set(frame.metric)))",
    ))
    assert "ROWS 20000 ['loss', 'lr']" in cell_text(nb.cells[3])
    # the panel ended as a picture of its final state (display/widget.py): the curves are inline SVG
    pictures = [o.data["text/html"] for o in nb.cells[2].outputs
                if o.output_type == "display_data" and "nl-panel" in o.data.get("text/html", "")]
    assert len(pictures) == 1
    html = pictures[0]
    assert html.count("<svg") == 2 and "data-metric='loss'" in html and "data-metric='lr'" in html
    for rank in range(2):
        assert f"class='nl-curve nl-curve-rank{rank}' d='M" in html
    assert "5000 pts" in html
    assert "class='nl-axis-step-last'" in html and ">4999</text>" in html   # the picture has the scale too


def _logs_without_a_bar(seconds):
    import time
    started = time.monotonic()
    i = 0
    while time.monotonic() - started < seconds:
        progress.log(loss=1.0 / (i + 1))
        i += 1
        time.sleep(0.001)
    return i


def test_values_logged_without_any_bar_are_sent_while_the_rank_runs(tmp_path):
    display = KeepStateDisplay()
    [count] = notebook_launcher(_logs_without_a_bar, args=(1.0,), num_processes=1, log_dir=str(tmp_path), ui=display)
    rs = display.state.ranks[0]
    assert rs.updates >= 2          # not only the final flush: the rank holds no backlog
    assert rs.curves["loss"].total == count
    assert len(load_metrics(tmp_path, pandas=False)["value"]) == count


def test_each_chart_has_a_scale_its_values_and_steps_labelled():
    """A chart says what it draws (issue 35): the value axis labelled with the lowest and highest
    value drawn, the step axis with its first and last step, ticks at each; in the HTML panel and
    so in the widget's final picture (the same render)."""
    import re
    state = _state_with_curves()
    page = html_display.render(state)
    charts = re.findall(r"<div class='nl-chart' data-metric='(\w+)'.*?</svg></div>", page)
    assert charts == ["loss", "lr"]
    loss = page[page.index("data-metric='loss'"):page.index("data-metric='lr'")]
    labels = dict(re.findall(r"<text class='nl-axis-([\w-]+)'[^>]*>([^<]*)</text>", loss))
    # rank 0's values fall from 1 to 1/300, rank 1's from 2 to 1 + 1/300 (points averaged in buckets)
    assert 1.5 < float(labels["max"]) <= 2 and 0 < float(labels["min"]) < 0.02, labels
    assert f"{labels['min']}…{labels['max']}" in loss   # the title's range: the same scale
    assert (labels["step-first"], labels["step-name"], labels["step-last"]) == ("0", "step", "299")
    assert loss.count("<line ") == 4   # a tick at each label
