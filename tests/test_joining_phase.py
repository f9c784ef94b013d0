"""While a rank's ``init_process_group`` waits for its peers, its row says so (issue 47, part 4):
"joining the process group", and, when every rank is on this machine, which peers it waits for.

Real ranks and a real gloo group: rank 2 holds back its ``init_process_group`` until the
notebook's display has seen ranks 0 and 1 say they wait for it (the display drops a file the
rank waits for), so nothing here depends on timing."""
from __future__ import annotations

import os

from notebook_launch import notebook_launcher
from notebook_launch.display import format as fmt
from notebook_launch.display.base import Display
from notebook_launch.display.rich_panel import _row as rich_row
from notebook_launch.display.rows import row_html

LATE = 2
WAITING = f"joining the process group, waiting for rank {LATE}"


class WatchingJoins(Display):
    """Keeps every rank's phase and text line; lets the late rank go once the others wait for it."""
    name = "watching"

    def __init__(self, go: str) -> None:
        super().__init__()
        self.go = go
        self.seen: dict[int, set[str]] = {}
        self.lines: list[str] = []
        self.rows: list[str] = []
        self.rich: list[str] = []
        self.final: list[tuple[str, str]] = []

    def refresh(self, state) -> None:
        for rs in state.ranks:
            shown = fmt.phase(rs)
            if shown:
                self.seen.setdefault(rs.rank, set()).add(shown)
                self.lines.append(fmt.rank_line(rs, width=200))
                self.rows.append(row_html(rs))
                self.rich.append(rich_row(rs)["progress"])
        waiting = [rs for rs in state.ranks if rs.rank != LATE and fmt.phase(rs) == WAITING]
        if len(waiting) == len(state.ranks) - 1 and not os.path.exists(self.go):
            with open(self.go, "w"):
                pass

    def close(self, state) -> None:
        self.refresh(state)
        self.final = [(rs.phase, rs.group_join) for rs in state.ranks]


def join_late(go: str) -> int:
    import time

    import torch.distributed as dist
    rank = int(os.environ["RANK"])
    if rank == LATE:
        deadline = time.monotonic() + 300   # generous: the test fails below if the display never saw it
        while not os.path.exists(go) and time.monotonic() < deadline:
            time.sleep(0.05)
    dist.init_process_group("gloo")
    dist.barrier()
    dist.destroy_process_group()
    return rank


def test_a_rank_row_says_it_joins_the_group_and_which_peer_it_waits_for(tmp_path):
    go = str(tmp_path / "go")
    display = WatchingJoins(go)
    results = notebook_launcher(join_late, args=(go,), num_processes=3, ui=display, log_dir=str(tmp_path / "logs"))
    assert results == [0, 1, 2]
    assert os.path.exists(go), display.seen
    for rank in (0, 1):
        assert WAITING in display.seen[rank], display.seen
    assert any(f"(joining the process group, waiting for rank {LATE})" in line for line in display.lines), \
        display.lines[-5:]
    assert any(WAITING in row for row in display.rows)    # the widget's row
    assert WAITING in display.rich                            # the rich panel's progress column
    assert display.final == [("", "joined")] * 3, display.final



def test_the_phase_shows_when_the_notebook_imported_torch_distributed_first(tmp_path):
    """torch.distributed imported in the notebook before the launch (the usual notebook): the rank's
    hooks then wrap c10d at once, after the rank's process_groups wrapper; its row still says it
    joins (the wrapper once went to an attribute named after that other wrapper, unused by torch)."""
    import torch.distributed  # noqa: F401
    test_a_rank_row_says_it_joins_the_group_and_which_peer_it_waits_for(tmp_path)


def test_a_rank_forked_from_a_process_that_said_it_joins_says_so_itself(tmp_path):
    """A process that said it joins a group (a rank that forks, a notebook that ran ranks' code)
    hands its record to its forks: a rank forked from it must still say it joins (its row
    otherwise never shows the phase, and a peer's row never says who is late)."""
    from notebook_launch.rank.group import joining
    joining._joining[os.getpid()] = True   # as after a join in this process that did not end
    try:
        test_a_rank_row_says_it_joins_the_group_and_which_peer_it_waits_for(tmp_path)
    finally:
        joining._joining.clear()
