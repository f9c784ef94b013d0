"""The metric curves stay faithful and cheap however long the run (issues 43 and 47): a bounded
number of points per line (min-max decimation: first and last point, each bucket's lowest and
highest), the scale's ends the real lowest and highest values, a log axis for a loss that spans
decades; and a real rank logging thousands of points leaves a bounded summary in the notebook
while load_metrics still reads every point back."""
import math
import random
import re

from helpers.panel_helpers import KeepStateDisplay

from notebook_launch import load_metrics, notebook_launcher, progress
from notebook_launch.display.curves import (HEIGHT, MAX_POINTS, chart_svg, curves_html, log_axis, min_max_points,
                                            sparkline)
from notebook_launch.record.metrics import CAPACITY, Series

N = 100_000


def _noisy_with_a_spike(n=N, spike_at=54_321):
    rng = random.Random(7)
    return [math.sin(i / 9000) + 0.1 * rng.random() + (5.0 if i == spike_at else 0.0) for i in range(n)]


def _falling_loss(n, first=4.285, last=6e-8):
    """first at step 0, last at step n - 1, exponentially in between: eight decades."""
    rate = math.log(first / last) / (n - 1)
    return [first * math.exp(-rate * i) for i in range(n)]


def _series(values, chunk=997):
    series = Series()
    for start in range(0, len(values), chunk):   # events bring uneven chunks
        series.extend(values[start:start + chunk])
    return series


def _paths(svg):
    """{rank: [(x, y), ...]} of every rank's line in a chart."""
    found = re.findall(r"class='nl-curve nl-curve-rank(\d+)' d='M([^']*)'", svg)
    return {int(rank): [tuple(map(float, p.split(","))) for p in d.split(" L")] for rank, d in found}


def _labels(svg):
    return dict(re.findall(r"<text class='nl-axis-([\w-]+)'[^>]*>([^<]*)</text>", svg))


def test_min_max_points_of_100000_points_are_bounded_and_keep_ends_spike_and_each_buckets_extremes():
    values = _noisy_with_a_spike()
    points = list(enumerate(values))
    line = min_max_points(points, MAX_POINTS)
    assert len(line) <= MAX_POINTS
    assert line[0] == (0, values[0]) and line[-1] == (N - 1, values[-1])
    assert (54_321, values[54_321]) in line                      # the one spike
    assert all(values[step] == value for step, value in line)   # real points, none invented
    assert [s for s, _ in line] == sorted({s for s, _ in line})  # in step order, each once
    inner, buckets = points[1:-1], (MAX_POINTS - 2) // 2
    for b in range(buckets):   # the documented buckets: each gives its lowest and its highest point
        chunk = inner[b * len(inner) // buckets:(b + 1) * len(inner) // buckets]
        assert min(chunk, key=lambda p: p[1]) in line and max(chunk, key=lambda p: p[1]) in line
    assert min_max_points(points[:50], MAX_POINTS) == points[:50]   # short lines are drawn as they are


def test_the_summary_keeps_first_latest_and_where_each_extreme_was_logged_through_every_merge():
    values = _noisy_with_a_spike()
    values[0], values[-1] = float("nan"), float("nan")   # a NaN is a step without a value
    series = _series(values)
    assert len(series) <= CAPACITY and series.total == N
    assert series.first == (1, values[1]) and series.latest == (N - 2, values[N - 2])
    extremes = series.extremes()
    assert len(extremes) <= 2 * CAPACITY + 2
    assert all(values[step] == value for step, value in extremes)
    assert (54_321, values[54_321]) in extremes
    finite = [v for v in values if not math.isnan(v)]
    assert min(v for _, v in extremes) == min(finite) and max(v for _, v in extremes) == max(finite)
    one_by_one = Series()
    for v in values[:5000]:
        one_by_one.add(v)
    assert one_by_one.extremes() == _series(values[:5000]).extremes()


def test_the_top_label_stays_the_first_highest_value_however_long_the_run():
    """Issue 47: at the end of a run the top label fell from 4.285 to 3.156, the first and highest
    loss averaged into a bucket that widens as the run goes on."""
    values = _falling_loss(N, last=0.5)
    svg = chart_svg("loss", [(0, _series(values))])
    assert _labels(svg)["max"] == "4.285" and _labels(svg)["min"] == "0.5", _labels(svg)
    [line] = _paths(svg).values()
    assert len(line) <= MAX_POINTS
    assert line[0] == (45.0, 1.0) and line[-1][1] == HEIGHT - 1   # step 0 at the top, the last step at the bottom


def test_a_spike_on_any_rank_reaches_its_line_and_the_scale():
    """Not only the first rank's: every rank's line keeps its buckets' extremes."""
    calm = [1.0 + 0.01 * (i % 10) for i in range(N)]
    spiky = list(calm)
    spiky[30_000] = 50.0
    svg = chart_svg("grad_norm", [(0, _series(calm)), (1, _series(spiky))])
    assert _labels(svg)["max"] == "50"
    paths = _paths(svg)
    assert all(len(line) <= MAX_POINTS for line in paths.values())
    assert min(y for _, y in paths[1]) == 1.0 and min(y for _, y in paths[0]) > HEIGHT - 3


def test_a_loss_from_4_3_to_6e_8_is_drawn_on_a_log_axis():
    values = _falling_loss(20_000, first=4.3, last=6e-8)
    series = _series(values)
    svg = chart_svg("loss", [(0, series)])
    labels = _labels(svg)
    assert labels["scale"] == "log" and labels["max"] == "4.3" and labels["min"] == "6e-08", labels
    assert "log scale" in svg and "class='nl-axis-decades'" in svg
    [line] = _paths(svg).values()
    middle = min(line, key=lambda p: abs(p[0] - (45 + 259 / 2)))   # half way: 5e-4, half way down in decades
    assert abs(middle[1] - HEIGHT / 2) < 4, middle
    shape = sparkline(series)
    assert shape[0] == "█" and shape[-1] == "▁" and len(set(shape)) >= 6, shape   # not '█▁▁▁▁▁▁▁▁▁▁▁'


def test_zeros_negatives_or_two_decades_at_most_keep_the_linear_axis():
    assert log_axis(1e-3, 10.0) and log_axis(1.0, 100.5)
    assert not log_axis(1.0, 100.0) and not log_axis(0.0, 10.0) and not log_axis(-1.0, 1e6)
    falling = _falling_loss(5000, first=4.3, last=6e-8)
    cases = {"zeros": falling[:-1] + [0.0], "negatives": [v - 1e-3 for v in falling],
             "narrow": [1.0 + 90.0 * v / 4.3 for v in falling]}
    for name, values in cases.items():
        svg = chart_svg(name, [(0, _series(values))])
        assert "nl-axis-scale" not in svg and "log scale" not in svg, name
        assert _labels(svg)["min"] == f"{min(values):.4g}", name   # the real lowest value, at the bottom


def _logs_quickly(n):
    for i in range(n):
        progress.log(loss=4.3 * math.exp(-i / 1100), acc=i / n)
    return n


class _ChartsSeen(KeepStateDisplay):
    """A real Display that draws the charts as the live panels do at each refresh, and keeps the
    most points any line had and the longest charts' HTML."""

    def __init__(self):
        super().__init__()
        self.most_points, self.longest = 0, 0

    def refresh(self, state):
        html = curves_html(state)
        self.longest = max(self.longest, len(html))
        self.most_points = max([self.most_points] + [len(line) for line in _paths(html).values()])


def test_a_rank_logging_20000_points_leaves_a_bounded_summary_and_every_point_on_disk(tmp_path):
    n = 20_000
    display = _ChartsSeen()
    notebook_launcher(_logs_quickly, args=(n,), num_processes=1, log_dir=str(tmp_path), ui=display)
    rs = display.state.ranks[0]
    for name in ("loss", "acc"):
        series = rs.curves[name]
        assert series.total == n
        held = (series.counts, series.sums, series.mins, series.maxs, series.min_steps, series.max_steps)
        assert all(len(column) <= CAPACITY for column in held)
    final = curves_html(display.state)
    assert display.most_points <= MAX_POINTS and all(len(line) <= MAX_POINTS for line in _paths(final).values())
    assert display.longest < 20_000 and len(final) < 20_000   # two charts of one rank: a few kB, whatever n
    loss_chart = final[final.index("data-metric='loss'"):final.index("data-metric='acc'")]
    assert _labels(loss_chart)["max"] == "4.3" and _labels(loss_chart)["scale"] == "log"
    logged = load_metrics(tmp_path, pandas=False)
    losses = [v for m, v in zip(logged["metric"], logged["value"]) if m == "loss"]
    assert losses == [4.3 * math.exp(-i / 1100) for i in range(n)]   # every point, in order
    assert logged["metric"].count("acc") == n
