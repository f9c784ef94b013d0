"""The terminal panel at 80 columns (issue 47, part 4): `notebook-launch demo` in an 80-column
terminal dropped "rank N" and the status from its final rows (rich squeezed the columns without a
ratio). The rank and its status keep their width; the other figures give way."""
from __future__ import annotations

import os
import subprocess
import sys

from rich.console import Console

from notebook_launch.display.rich_panel import render
from notebook_launch.record.resources import RankUsage
from notebook_launch.record.state import DONE, Bar, RankState, RunState

MiB = 2**20


def final_state(ranks: int) -> RunState:
    state = RunState("20261129-040000-1234567890", ranks, "fork", "/root/.cache/notebook_launch/runs/x",
                     [RankState(r, r, status=DONE) for r in range(ranks)])
    for rs in state.ranks:
        rs.bars["b"] = Bar("b", desc="train", n=300, total=300, rate=41.5, elapsed=7.2, closed=True)
        rs.metrics = {"loss": 0.0123, "lr": 0.05}
    usage = RankUsage(rss=320 * MiB, uss=18 * MiB, cpu_average=97.0, peak_rss=330 * MiB, peak_uss=20 * MiB)
    state.on_resources({rs.local_rank: usage for rs in state.ranks}, None)
    state.finish(DONE, f"{ranks} ranks finished in 7.2 s")
    return state


def rows_at(width: int, state: RunState) -> list[str]:
    console = Console(width=width, record=True, color_system=None)
    console.print(render(state))
    return [line for line in console.export_text().splitlines() if "rank " in line and "│" in line]


def test_at_80_columns_every_row_keeps_its_rank_and_status():
    for ranks in (2, 12):
        rows = rows_at(80, final_state(ranks))
        assert len(rows) == ranks, rows
        for rank, row in enumerate(rows):
            assert f"rank {rank} " in row and " done " in row, row


def test_the_demo_in_an_80_column_terminal_says_every_rank_and_its_status():
    env = dict(os.environ, COLUMNS="80", LINES="40")
    done = subprocess.run([sys.executable, "-m", "notebook_launch", "demo", "-n", "2", "--steps", "20", "--ui", "rich"],
                          capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    final = done.stdout.rsplit("notebook_launch ", 1)[-1]   # the last panel drawn
    for rank in (0, 1):
        assert any(f"rank {rank} " in line and " done " in line for line in final.splitlines()), done.stdout[-3000:]
