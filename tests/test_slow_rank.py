"""The slow rank named (issue 34 item 4), from plain data: the verdict's shapes (no slow rank,
one, two, a rank that never reaches a collective, one rank only, too little to say), how a
rank's samples fold into spans, the rank side's counters, and the verdict and each rank's pace
in every display. The launches that make one rank slow are in test_slow_rank_launch.py."""
import io

import pytest

from notebook_launch.record import slow_rank
from notebook_launch.display import format as fmt
from notebook_launch.display import rows
from notebook_launch.display import html as html_display
from notebook_launch.display import pace as pace_display
from notebook_launch.display.rich_panel import render as rich_render
from notebook_launch.rank.reports import pace as rank_pace
from notebook_launch.record.slow_rank import PaceHistory, RankPace, Spread, verdict
from notebook_launch.record.state import DONE, FAILED, RankState, RunState


def steady(rank, waiting_share, seconds=10.0, steps=100, op="all_reduce", extra=None):
    """A rank that called ``op`` ``steps`` times in ``seconds`` and spent ``waiting_share`` of it
    inside, alike in each of its stretches (one a second)."""
    ops = {op: (steps, waiting_share * seconds)}
    ops.update(extra or {})
    pace = RankPace(rank=rank, seconds=seconds, ops=ops)
    return RankPace(rank=rank, seconds=seconds, ops=ops, spread=Spread.of([pace.share] * int(seconds)))


def named(paces):
    """The verdict, which the test expects to name someone."""
    found = verdict(paces)
    assert found is not None, paces
    return found


def whole(history):
    span = history.whole_run(0)
    assert span is not None
    return span


def sent(pace, force=False):
    taken = pace.sample(force=force)
    assert taken is not None
    return taken


# --- the verdict's shapes ---------------------------------------------------------------------

def test_balanced_ranks_name_nobody():
    paces = {0: steady(0, 0.10), 1: steady(1, 0.12), 2: steady(2, 0.09), 3: steady(3, 0.11)}
    assert verdict(paces) is None


def test_ranks_that_all_wait_alike_name_nobody():
    """A run whose collectives are slow for everyone (communication-bound) is held back by no rank,
    though the shares differ enough that the busy parts differ by more than SLOWER."""
    paces = {0: steady(0, 0.80), 1: steady(1, 0.74), 2: steady(2, 0.80), 3: steady(3, 0.79)}
    assert verdict(paces) is None


def test_one_slow_rank_is_named_with_its_ratio_and_the_others_wait():
    paces = {0: steady(0, 0.44), 1: steady(1, 0.45), 2: steady(2, 0.02), 3: steady(3, 0.43)}
    found = named(paces)
    assert [rank for rank, _ in found.slow] == [2]
    assert found.waiting == (0, 1, 3) and found.op == "all_reduce"
    # its own work per step (9.8 s / 100) against the waiters' median (5.6 s / 100)
    assert found.slow[0][1] == pytest.approx(9.8 / 5.6)
    assert found.text == ("rank 2 is the slowest (1.8x); ranks 0, 1, 3 spend 44% of their time "
                          "waiting for it in all_reduce")


def test_two_slow_ranks_are_named_slowest_first():
    paces = {0: steady(0, 0.60), 1: steady(1, 0.62), 2: steady(2, 0.05), 3: steady(3, 0.02)}
    found = named(paces)
    assert [rank for rank, _ in found.slow] == [3, 2]
    assert found.text == ("ranks 3, 2 are the slowest (2.5x, 2.4x); ranks 0, 1 spend 61% of their time "
                          "waiting for them in all_reduce")


def test_the_collective_named_is_the_one_the_others_wait_in_most():
    """Each step calls barrier three times (the step collective), but the waiting is in all_reduce."""
    barrier = {"barrier": (300, 0.2)}
    paces = {0: steady(0, 0.5, extra=barrier), 1: steady(1, 0.0, extra=barrier)}
    assert paces[0].step == "barrier"
    found = named(paces)
    assert found.text == "rank 1 is the slowest (2.0x); rank 0 spends 52% of its time waiting for it in all_reduce"


def test_a_rank_that_never_reaches_a_collective_is_waited_for():
    """Ranks 0-2 sit in their first all_reduce (no call returned yet); rank 3 sent no pace at all."""
    waiting = {rank: RankPace(rank=rank, seconds=12.0, ops={"all_reduce": (0, 11.9)}, inside="all_reduce")
               for rank in range(3)}
    found = named({**waiting, 3: None})
    assert found.not_reached and found.slow == ((3, None),)
    assert found.text == ("rank 3 has not reached a collective yet; ranks 0, 1, 2 spend 99% of their time "
                          "waiting for it in all_reduce")


def test_a_rank_without_pace_is_not_blamed_when_nobody_waits_for_it():
    """Rank 1 is in no group the others use: they call collectives among themselves and barely wait."""
    assert verdict({0: steady(0, 0.05), 1: None, 2: steady(2, 0.06)}) is None


def test_one_rank_only_says_nothing():
    assert verdict({0: steady(0, 0.9)}) is None
    assert verdict({0: None}) is None


def test_no_pace_at_all_says_nothing():
    """NOTEBOOK_LAUNCH_WHEREABOUTS=0, or no collective yet anywhere."""
    assert verdict({0: None, 1: None, 2: None}) is None


def test_too_little_to_compare_says_nothing():
    few_calls = {0: steady(0, 0.6, steps=2), 1: steady(1, 0.01, steps=2)}
    short = {0: steady(0, 0.6, seconds=0.5), 1: steady(1, 0.01, seconds=0.5)}
    one_young = {0: steady(0, 0.6), 1: steady(1, 0.6), 2: steady(2, 0.01, seconds=0.5)}
    assert verdict(few_calls) is None and verdict(short) is None and verdict(one_young) is None


def test_a_rank_a_little_slower_is_not_named():
    """Rank 2 waits less, but its own work per step is only 1.2x the others' (SLOWER is 1.3)."""
    paces = {0: steady(0, 0.30), 1: steady(1, 0.30), 2: steady(2, 0.16)}
    assert verdict(paces) is None


def test_ratios_read_as_a_person_would_say_them():
    assert slow_rank._ratio(1.84) == "1.8x" and slow_rank._ratio(23.4) == "23x"
    assert slow_rank._ratio(float("inf")) == ">100x" and slow_rank._ratio(None) == "?"


def test_a_rank_row_says_its_step_rate_and_waiting_share():
    assert slow_rank.row_text(steady(0, 0.44)) == "10.0 all_reduce/s, 44% waiting"
    assert slow_rank.row_text(steady(0, 0.44, seconds=200)) == "2.00 s/all_reduce, 44% waiting"
    first = RankPace(rank=0, seconds=3.0, ops={"barrier": (0, 3.0)}, inside="barrier")
    assert slow_rank.row_text(first) == "in barrier" and slow_rank.row_text(None) == ""


def test_a_handful_of_calls_is_not_shown_as_a_rate():
    """One barrier read "752.6 barrier/s, 100% waiting", one final all_gather "371 all_gather/s":
    a rate needs MIN_CALLS calls of the step over MIN_SECONDS."""
    one_barrier = RankPace(rank=0, seconds=0.0013, ops={"barrier": (1, 0.0013)})
    one_gather_in_a_long_run = RankPace(rank=0, seconds=30.0, ops={"all_gather": (1, 0.01)})
    two_in_a_second = RankPace(rank=0, seconds=1.5, ops={"all_reduce": (2, 0.1)})
    quick_ones = RankPace(rank=0, seconds=0.5, ops={"all_reduce": (50, 0.1)})
    for pace in (one_barrier, one_gather_in_a_long_run, two_in_a_second, quick_ones):
        assert slow_rank.row_text(pace) == "", pace
    assert slow_rank.row_text(RankPace(rank=0, seconds=1.5, ops={"all_reduce": (2, 0.1)}, inside="barrier")) == \
        "in barrier"
    enough = RankPace(rank=0, seconds=1.0, ops={"all_reduce": (slow_rank.MIN_CALLS, 0.5)})
    assert slow_rank.row_text(enough) == "3.0 all_reduce/s, 50% waiting"


# --- the samples a rank sends, folded ---------------------------------------------------------

def sample(at, calls, seconds, inside=None, first=False, since=100.0, op="all_reduce", moved=True):
    return {"since": since, "at": at, "waiting": seconds, "ops": {op: [calls, seconds]}, "inside": inside,
            "first": first, "moved": moved}


def test_a_rank_first_sample_counts_from_its_first_collective():
    history = PaceHistory()
    history.add(sample(101.0, 10, 0.5, first=True))
    span = whole(history)
    assert span.seconds == pytest.approx(1.0) and span.ops == {"all_reduce": (10, 0.5)}


def test_a_later_first_sample_counts_from_itself():
    """A persistent rank's call: its totals hold its earlier calls, which are no part of this one."""
    history = PaceHistory()
    history.add(sample(500.0, 1000, 40.0))
    history.add(sample(502.0, 1020, 41.0))
    assert whole(history).ops == {"all_reduce": (20, 1.0)} and whole(history).seconds == 2.0


def test_the_live_window_keeps_the_last_seconds_and_the_whole_run_all():
    history = PaceHistory()
    history.add(sample(101.0, 10, 0.1, first=True))
    for second in range(2, 61):   # the first half slow (little waiting), then much waiting
        waited = 0.1 * second if second <= 30 else 3.0 + 0.8 * (second - 30)
        history.add(sample(100.0 + second, 10 * second, waited))
    window = history.window(0)
    assert window is not None
    assert window.seconds == pytest.approx(slow_rank.WINDOW) and window.share == pytest.approx(0.8)
    assert whole(history).seconds == pytest.approx(60.0)
    assert len(history.recent) <= slow_rank.WINDOW + 2


def test_a_sample_of_another_shape_is_ignored():
    history = PaceHistory()
    history.add({"unexpected": True})
    history.add({"at": 1.0, "ops": {"all_reduce": ["x"]}})
    assert history.whole_run(0) is None and history.window(0) is None


def test_only_a_sample_that_says_the_rank_still_waits_is_no_sign_of_progress():
    assert slow_rank.only_waiting({"bars": {}, "metrics": {}, "series": {}, "pace": sample(1.0, 3, 1.0, moved=False)})
    assert not slow_rank.only_waiting({"bars": {}, "metrics": {}, "series": {}, "pace": sample(1.0, 3, 1.0)})
    assert not slow_rank.only_waiting({"bars": {"b0": {"n": 3}}, "pace": sample(1.0, 3, 1.0, moved=False)})
    assert not slow_rank.only_waiting({"bars": {"b0": {"n": 3}}})


# --- the rank side's counters -----------------------------------------------------------------

class SteppedClock:
    """The rank side's clock, moved by the test: the counters' arithmetic, not the machine's speed."""

    def __init__(self):
        self.now = 50.0

    def __call__(self):
        return self.now


def test_the_rank_counts_calls_and_time_inside_and_samples_once_a_second(monkeypatch):
    clock = SteppedClock()
    monkeypatch.setattr(rank_pace, "_clock", clock)
    started = []
    pace = rank_pace.Pace(on_first=lambda: started.append(clock.now))
    assert pace.sample(force=True) is None                 # nothing counted yet
    for _ in range(4):                                      # 0.3 s of work, 0.2 s inside, four times
        clock.now += 0.3
        entered = pace.enter("all_reduce")
        clock.now += 0.2
        pace.leave("all_reduce", entered)
    assert started == [50.3]                                # the sender started at the first collective
    first = sent(pace)
    assert first["first"] and first["moved"] and first["inside"] is None
    assert first["since"] == 50.3 and first["at"] == pytest.approx(52.0)
    assert first["ops"] == {"all_reduce": [4, pytest.approx(0.8)]} and first["waiting"] == pytest.approx(0.8)
    assert pace.sample() is None                            # not due again within SAMPLE_INTERVAL
    clock.now += 0.1
    entered = pace.enter("barrier")                         # now it waits in a barrier...
    clock.now += 2.0
    waiting = sent(pace)                                    # ...counted up to now, though not returned
    assert waiting["inside"] == "barrier" and not waiting["moved"] and not waiting["first"]
    assert waiting["at"] == pytest.approx(54.1) and waiting["ops"]["barrier"] == [0, pytest.approx(2.0)]
    pace.leave("barrier", entered)
    assert pace.sample() is None                            # returned, but the last sample is too recent
    final = sent(pace, force=True)                           # the rank's last flush sends it anyway
    assert final["moved"] and final["ops"]["barrier"] == [1, pytest.approx(2.0)]
    assert pace.sample(force=True) is None                  # nothing changed since


def test_a_rank_state_folds_pace_from_progress_and_a_restart_forgets_it():
    from notebook_launch.wire.plan import RankSpec
    state = run_state(2)
    state.on_progress(0, {"bars": {}, "metrics": {}, "series": {}, "pace": sample(103.0, 30, 1.5, first=True)})
    assert whole(state.ranks[0].pace).calls == 30
    specs = [RankSpec(global_rank=i, local_rank=i, device="cpu", env={}) for i in range(2)]
    state.begin_attempt(1, node_rank=0, num_nodes=1, world_size=2, ranks=specs)
    assert state.ranks[0].pace.whole_run(0) is None


# --- every display ----------------------------------------------------------------------------

def run_state(world):
    return RunState(run_id="r1", world_size=world, backend="fork", log_dir="/tmp/logs",
                    ranks=[RankState(rank=i, local_rank=i) for i in range(world)])


def held_back_state(status=None):
    """Four ranks 30 s into a run; rank 2 works 3.5x as long per step as the others, who wait."""
    state = run_state(4)
    for rank in range(4):
        state.on_ready(rank, {"pid": 100 + rank})
        share = 0.02 if rank == 2 else 0.72
        state.on_progress(rank, {"pace": sample(100.0, 0, 0.0, first=True)})
        for second in range(1, 31):
            state.on_progress(rank, {"pace": sample(100.0 + second, 10 * second, share * second)})
    if status is not None:
        for rank in range(4):
            state.on_exit(rank, status, "exit code 0" if status == DONE else "exit code 1")
        state.finish(status, "4 ranks finished in 30 s")
    return state


VERDICT = "rank 2 is the slowest (3.5x); ranks 0, 1, 3 spend 72% of their time waiting for it in all_reduce"


def test_the_text_summary_names_the_slow_rank_live_and_at_the_end():
    for state in (held_back_state(), held_back_state(DONE)):
        text = fmt.summary(state)
        assert f"pace: {VERDICT}" in text, text
        assert "rank 2 [cpu]" in text and "(10.0 all_reduce/s, 2% waiting)" in text
        assert "(10.0 all_reduce/s, 72% waiting)" in text


def test_a_failed_run_says_nothing_of_pace():
    state = held_back_state(FAILED)
    assert pace_display.verdict(state) is None and "pace:" not in fmt.summary(state)
    assert "all_reduce/s" not in fmt.summary(state)


def test_the_html_panel_and_the_final_picture_name_the_slow_rank():
    for state in (held_back_state(), held_back_state(DONE)):
        page = html_display.render(state)
        assert "class='nl-slow-rank'" in page and VERDICT in page
        assert page.count("class='nl-pace'") == 4
        assert "10.0 all_reduce/s, 2% waiting" in rows.row_html(state.ranks[2])
    assert "nl-slow-rank" not in html_display.render(balanced_state())


def balanced_state():
    state = run_state(2)
    for rank in range(2):
        state.on_progress(rank, {"pace": sample(100.0, 0, 0.0, first=True)})
        state.on_progress(rank, {"pace": sample(110.0, 100, 1.0)})
    return state


def test_the_rich_panel_names_the_slow_rank():
    from rich.console import Console
    out = io.StringIO()
    Console(file=out, width=240, force_terminal=False, color_system=None).print(rich_render(held_back_state(DONE)))
    text = out.getvalue()
    assert f"pace: {VERDICT}" in text and "2% waiting" in text


def test_the_widget_panel_has_a_line_for_the_slow_rank(monkeypatch):
    pytest.importorskip("ipywidgets")
    from helpers.widget_comms import recording_comms

    from notebook_launch.display import widget as widget_module
    from notebook_launch.display.widget import WidgetDisplay
    recording_comms(monkeypatch)
    monkeypatch.setattr(widget_module, "_show", lambda panel, text: None)
    state = held_back_state()
    display = WidgetDisplay(print_lines=False, poll_kernel=False)
    display.start(state)
    assert VERDICT in display.slow_rank.value and display.slow_rank in display.panel.children
    assert "2% waiting" in rows.row_html(state.ranks[2]) and rows.row_html(state.ranks[2]) in display.rows.value
    display.close(state)
