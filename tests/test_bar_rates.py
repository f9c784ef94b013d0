"""A bar's rate means something from its first second (issue 47, part 1): the Transformers
Trainer's first update moves its bar 0 -> 2 in one call, and the rank's sender could publish
microseconds later, dividing 2 by microseconds (7,378 and 14,109 step/s for a run of about 43);
the smoothing carried that to the end of a short run. Every bar (tqdm, rich, Lightning, the
Trainer, ``progress()``) goes through ``rank.reports.progress.Progress``: here a bar made as the Trainer
makes it, in real ranks, every rate the panel was given recorded.

Nothing is timed: each step sleeps 50 ms, so no honest rate over any span is above 20 steps a
second (a busy machine only makes steps longer); the first jump of 2 adds at most 2 / RATE_SPAN."""
from __future__ import annotations

from notebook_launch import notebook_launcher
from notebook_launch.display.base import Display
from notebook_launch.rank.reports.progress import RATE_SPAN

STEP_SECONDS = 0.05
HONEST_MOST = 1 / STEP_SECONDS + 2 / RATE_SPAN


class RecordingRates(Display):
    """Every rate of every bar, at every refresh and at the end."""
    name = "recording"

    def __init__(self) -> None:
        super().__init__()
        self.rates: list[float] = []
        self.final: dict[int, list] = {}

    def refresh(self, state) -> None:
        self.rates += [bar.rate for rs in state.ranks for bar in rs.bars.values() if bar.rate]

    def close(self, state) -> None:
        self.refresh(state)
        self.final = {rs.rank: list(rs.bars.values()) for rs in state.ranks}


def trainer_like_loop():
    """As transformers' ProgressCallback does: the bar made, then update(2) at once (two steps
    logged together), then one step at a time."""
    import time

    from tqdm.auto import tqdm
    bar = tqdm(total=42)
    bar.update(2)
    for _ in range(40):
        time.sleep(STEP_SECONDS)
        bar.update(1)
    bar.close()


def test_a_bar_whose_first_update_jumps_gets_a_rate_from_a_real_interval(tmp_path):
    display = RecordingRates()
    notebook_launcher(trainer_like_loop, num_processes=2, ui=display, log_dir=str(tmp_path))
    assert display.rates, "no bar had a rate"
    assert max(display.rates) <= HONEST_MOST, sorted(display.rates)[-5:]
    for rank, bars in display.final.items():
        (bar,) = bars
        assert bar.closed and bar.n == 42, bar
        average = bar.n / bar.elapsed
        assert average / 2 <= bar.rate <= min(2 * average, HONEST_MOST), (rank, bar.rate, average)
