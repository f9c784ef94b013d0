"""The slow-rank verdict on loops shaped like real training runs (issue 47), from plain data: each
rank's work before each collective is a list of numbers, the rank side's real counters turn it
into the samples a rank sends (``helpers.pace_runs``, on a simulated clock), and the notebook's
``PaceHistory`` folds them as it folds a launch's.

The same work on every rank is named nobody, whatever a real loop does now and then: per-step
jitter, rank 0 alone evaluating now and then, rank 0 preparing the data while rank 1 waits in a
barrier, a tiny run, the ranks late in turns (the whole run's totals named "rank 0 is the
slowest (1.4x)" or ">100x" on each). A rank slower at every step is still named, with a ratio
near the truth; one slow only while it loaded its data is named live, then not at the end."""
import random

import pytest

from helpers.pace_runs import samples_of_a_loop

from notebook_launch.record import slow_rank
from notebook_launch.record.slow_rank import PaceHistory, RankPace, ShareTally, SlowVerdict, Spread, verdict


def jittered(rng, steps, low=0.02, high=0.06):
    """A rank's work before each step: a little different every step."""
    return [rng.uniform(low, high) for _ in range(steps)]


def histories(works, ops=None):
    """Each rank's PaceHistory, fed the samples its counters send in this loop."""
    folded = {}
    for rank, samples in samples_of_a_loop(works, ops).items():
        folded[rank] = PaceHistory()
        for sample in samples:
            folded[rank].add(sample)
    return folded


def final_verdict(works, ops=None) -> SlowVerdict | None:
    """The final picture's verdict: each rank's whole run compared."""
    return verdict({rank: history.whole_run(rank) for rank, history in histories(works, ops).items()})


def live_verdicts(works, ops=None) -> list[SlowVerdict | None]:
    """The panel's verdict each time every rank sent one more sample (the last WINDOW seconds)."""
    samples = samples_of_a_loop(works, ops)
    folded = {rank: PaceHistory() for rank in samples}
    seen = []
    for index in range(max(len(sent) for sent in samples.values())):
        for rank, sent in samples.items():
            if index < len(sent):
                folded[rank].add(sent[index])
        seen.append(verdict({rank: history.window(rank) for rank, history in folded.items()}))
    return seen


def slow_ranks(found: SlowVerdict | None) -> list[int]:
    return [] if found is None else [rank for rank, _ in found.slow]


# --- the same work on both ranks names nobody ------------------------------------------------

def test_rank_0_evaluating_now_and_then_is_not_named():
    """300 jittered steps (about 14 s); every 60th, rank 0 alone evaluates for 1.2 s while rank 1
    waits in its all_reduce: a third of rank 1's time in all, in a few stretches."""
    rng = random.Random(1)
    works = [jittered(rng, 300), jittered(rng, 300)]
    for step in range(60, 300, 60):
        works[0][step] += 1.2
    assert final_verdict(works) is None


def test_a_tiny_run_after_rank_0_prepared_the_data_names_nobody():
    """A barrier at the start, rank 0 preparing the data for 4 s while rank 1 waits in the next
    (``main_process_first``), then ten quick steps: the totals said '>100x'."""
    works = [[0.01, 4.0] + [0.001] * 10, [0.01, 0.01] + [0.001] * 10]
    ops = ["barrier", "barrier"] + ["all_reduce"] * 10
    assert final_verdict(works, ops) is None
    assert not any(live_verdicts(works, ops))


def test_a_run_after_rank_0_prepared_the_data_names_nobody():
    """The same start, then 200 jittered steps alike on both ranks."""
    rng = random.Random(2)
    works = [[0.01, 4.0] + jittered(rng, 200), [0.01, 0.01] + jittered(rng, 200)]
    assert final_verdict(works, ["barrier", "barrier"] + ["all_reduce"] * 200) is None


def test_ranks_late_in_turns_are_not_named():
    """Each rank is late by 0.1 s a step for a while, then the other (the OS running one behind):
    rank 0 for 26 steps of 40, rank 1 for 14, for 400 steps (a minute)."""
    rng = random.Random(3)
    works = [jittered(rng, 400, 0.04, 0.06), jittered(rng, 400, 0.04, 0.06)]
    for step in range(400):
        works[0 if step % 40 < 26 else 1][step] += 0.1
    assert final_verdict(works) is None


def test_waiting_a_little_is_not_being_held_back():
    """Rank 1 works 1.3x as long as rank 0 at every step, with no jitter: rank 0 waits 24% of its
    time (under HELD_BACK), though the work per step is over SLOWER."""
    works = [[0.1] * 150, [0.1316] * 150]
    assert slow_rank.HELD_BACK > 0.24
    assert final_verdict(works) is None


# --- a rank that holds the others back is named ----------------------------------------------

def test_a_rank_slower_at_every_step_is_named_live_and_at_the_end():
    """Rank 1 works 1.5x as long as rank 0, at every step, each step jittered."""
    rng = random.Random(4)
    works = [jittered(rng, 150, 0.06, 0.08), jittered(rng, 150, 0.09, 0.12)]
    found = final_verdict(works)
    assert slow_ranks(found) == [1] and found is not None and found.waiting == (0,)
    ratio = found.slow[0][1]
    assert ratio is not None and 1.3 <= ratio <= 1.7, found.text
    assert found.text.startswith("rank 1 is the slowest (1.") and "rank 0 spends 3" in found.text, found.text
    assert [1] in [slow_ranks(seen) for seen in live_verdicts(works)]


def test_a_rank_slow_only_while_it_loads_its_data_is_named_live_not_at_the_end():
    """Rank 1's data loader takes 0.1 s more for the first 40 steps (6 s), then both ranks work
    alike for 200 steps: the totals named it (1.3x)."""
    rng = random.Random(5)
    works = [jittered(rng, 240, 0.04, 0.06), jittered(rng, 240, 0.04, 0.06)]
    for step in range(40):
        works[1][step] += 0.1
    live = [slow_ranks(seen) for seen in live_verdicts(works)]
    assert [1] in live and live[-1] == []
    assert final_verdict(works) is None


def test_ranks_that_only_wait_give_no_ratio():
    """Rank 1 does nothing but wait for rank 0 (0.5 ms of its own a step against 200 ms): rank 0
    is named, with no ratio divided by rank 1's near-zero work (the totals said '>100x')."""
    found = final_verdict([[0.2] * 60, [0.0005] * 60])
    assert found is not None and found.slow == ((0, None),)
    assert found.text == "rank 0 is the slowest; rank 1 spends 100% of its time waiting for it in all_reduce"


# --- the evidence, bounded -------------------------------------------------------------------

def test_a_run_of_hours_keeps_bounded_evidence():
    """Four hours of samples a second: the whole run's stretches are counted, not kept."""
    history = PaceHistory()
    history.add({"since": 0.0, "at": 0.5, "ops": {"all_reduce": [5, 0.2]}, "first": True})
    hours = 4 * 3600
    for second in range(1, hours + 1):
        history.add({"at": 0.5 + second, "ops": {"all_reduce": [5 + 10 * second, 0.2 + 0.3 * second]}})
    whole = history.whole_run(0)
    assert whole is not None and whole.spread is not None
    assert whole.spread.stretches == hours + 1 and whole.spread.typical == pytest.approx(0.3)
    assert len(history.recent) <= slow_rank.WINDOW + 2
    assert len(history.last_stretches) <= slow_rank.WINDOW + 1
    assert len(history.stretches.counts) == len(history.stretches.sums) == slow_rank.SHARE_BINS


def test_a_spread_counts_each_stretch_once_by_quartiles():
    """Nearest rank: of 8 stretches the 2nd, 4th and 6th least waiting; a long wait is one of them."""
    spread = Spread.of([0.9, 0.1, 0.1, 0.1, 0.5, 0.7, 0.3, 0.2])
    assert spread.stretches == 8 and spread.low == pytest.approx(0.1) and spread.typical == pytest.approx(0.2)
    assert spread.high == pytest.approx(0.5)
    assert Spread.of([0.44] * 10).typical == pytest.approx(0.44)
    assert Spread.of([]) == Spread(stretches=0, low=0.0, typical=0.0, high=0.0)
    tally = ShareTally()
    for share in (1.0, 1.5, -0.2):   # a sample's rounding can cross the ends: still counted, within 0..1
        tally.add(share)
    assert tally.spread() == Spread(stretches=3, low=0.0, typical=1.0, high=1.0)


def test_a_pace_without_stretches_is_not_compared():
    """A pace of totals only (from another source than PaceHistory) is too little to say."""
    totals = {rank: RankPace(rank=rank, seconds=10.0, ops={"all_reduce": (100, share)})
              for rank, share in ((0, 6.0), (1, 0.1))}
    assert verdict(totals) is None
