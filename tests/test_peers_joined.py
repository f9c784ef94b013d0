"""No rank leaves a gloo group while a peer is still joining it (``rank/group/peers_joined.py``).

The race it closes: a rank whose ``init_process_group`` returned ends (or destroys the group) while
a peer is still in gloo's connectFullMesh, which then fails with "Connection reset/closed by peer".
On a busy machine it took a launch in 12 to 20 of ranks that only join and return; a real race is
too rare to test on, so here one rank is made slow to finish joining: it counts itself in only
``SLOW`` seconds after its init returned (what a peer descheduled in connectFullMesh looks like to
the others), and looks, just before it does, whether the others are still there. Every way a rank
leaves is checked: returning with the group alive, ``dist.destroy_process_group()``, and a
``destroy_process_group`` imported before the launch (a reference our wrapper never replaced).
"""
from __future__ import annotations

import os
import pathlib
import time

import pytest
from torch.distributed import destroy_process_group as destroy_taken_before_the_launch

from notebook_launch import notebook_launcher

SLOW = 2.0    # seconds the last rank takes to count itself in after its init returned
WORLD = 3


def alive(pid: int) -> bool:
    """Whether ``pid`` runs still (an ended rank the notebook has not reaped yet is a zombie)."""
    try:
        state = pathlib.Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def join_and_leave(folder: str, leaving: str, subgroup: bool = False) -> list[int] | None:
    """Each rank joins the group (``subgroup``: then a group of ranks 1 and 2) and leaves at once;
    the last one joins slowly and returns which of the others were still running when it counted
    itself in (None: it never did)."""
    import torch.distributed as dist

    from notebook_launch.rank.group import peers_joined

    rank = int(os.environ["RANK"])
    pathlib.Path(folder, f"pid-{rank}").write_text(str(os.getpid()))
    seen: dict[str, list[int]] = {}   # who was still running, once the slow rank counts in
    others = [1] if subgroup else list(range(WORLD - 1))
    if rank == WORLD - 1:
        count_in = peers_joined.count_in

        def slow_count_in(dist, group):
            if group.size() != (2 if subgroup else WORLD):
                return count_in(dist, group)
            time.sleep(SLOW)
            pids = {peer: int(pathlib.Path(folder, f"pid-{peer}").read_text()) for peer in others}
            seen["running"] = [peer for peer, pid in pids.items() if alive(pid)]
            return count_in(dist, group)

        peers_joined.count_in = slow_count_in
    dist.init_process_group("gloo")
    group = dist.new_group([1, 2]) if subgroup else None
    if subgroup and rank == 2:
        pathlib.Path(folder, "rank-2-joined").touch()
    if subgroup and rank == 0:   # no member; but it hosts the store the members join through
        deadline = time.monotonic() + 60
        while not pathlib.Path(folder, "rank-2-joined").exists():
            assert time.monotonic() < deadline, "rank 2 did not make its group within 60 s"
            time.sleep(0.01)
        return None
    if leaving == "destroy":
        dist.destroy_process_group(group)
    elif leaving == "destroy taken before the launch":
        destroy_taken_before_the_launch(group)
    return seen.get("running") if rank == WORLD - 1 else None


@pytest.mark.parametrize("leaving, start_method", [
    ("return", "fork"), ("destroy", "fork"), ("destroy taken before the launch", "fork"), ("return", "spawn")])
def test_no_rank_ends_before_a_slow_peer_has_joined(tmp_path, leaving, start_method):
    results = notebook_launcher(join_and_leave, args=(str(tmp_path), leaving), num_processes=WORLD,
                                start_method=start_method, ui="none")
    assert results[WORLD - 1] == list(range(WORLD - 1)), "ranks had ended before the last rank joined"


@pytest.mark.parametrize("leaving", ["return", "destroy"])
def test_no_member_leaves_a_new_group_before_a_slow_member_has_joined(tmp_path, leaving):
    """``new_group`` connects its members as init does: rank 1 neither ends nor destroys the group
    of ranks 1 and 2 before rank 2 has joined it. (Rank 0, no member, stays until then: the members
    join through the store it hosts, as in plain torch.)"""
    results = notebook_launcher(join_and_leave, args=(str(tmp_path), leaving, True), num_processes=WORLD,
                                ui="none")
    assert results[WORLD - 1] == [1], "rank 1 had left the group of ranks 1 and 2 before rank 2 joined it"


def never_counts_in(folder: str) -> float | None:
    """Rank 1 never counts itself in (a peer whose store is gone, say): rank 0 waits for it no longer
    than its limit, then ends. Rank 1 returns how long rank 0 was still there after it joined."""
    import torch.distributed as dist

    from notebook_launch.rank.group import peers_joined

    rank = int(os.environ["RANK"])
    pathlib.Path(folder, f"pid-{rank}").write_text(str(os.getpid()))
    if rank == 1:
        peers_joined.count_in = lambda *args: None
    else:
        peers_joined.WAIT_LIMIT = 1.0
    dist.init_process_group("gloo")
    if rank == 0:
        return None
    joined = time.monotonic()
    peer = int(pathlib.Path(folder, "pid-0").read_text())
    while alive(peer):
        assert time.monotonic() - joined < 60, "rank 0 waited for rank 1 past its limit"
        time.sleep(0.01)
    return time.monotonic() - joined


def test_a_peer_that_never_counts_in_holds_a_rank_only_for_its_limit(tmp_path):
    from notebook_launch.rank.group import peers_joined
    results = notebook_launcher(never_counts_in, args=(str(tmp_path),), num_processes=2, ui="none")
    assert results[0] is None and results[1] is not None
    # its own limit (1 s), not the default one: what is left of the default is slack for a busy machine
    assert results[1] < peers_joined.WAIT_LIMIT


def uses_the_store_while_a_peer_joins(folder: str) -> bool | None:
    """Rank 0 writes a key on the group's store right after its init, while rank 2 has not counted
    itself in yet; rank 2 waits for that key before it does. A thread of ours that held rank 0's
    store client (a client serves one request at a time) until every peer joined would hold that
    write back until rank 2 gives up: rank 2 returns whether it saw the key."""
    import datetime

    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    from notebook_launch.rank.group import peers_joined

    peers_joined.WAIT_LIMIT = 60.0   # longer than rank 2 waits: no limit of ours ends a stall here
    rank = int(os.environ["RANK"])
    seen: dict[str, bool] = {}
    if rank == WORLD - 1:
        count_in = peers_joined.count_in

        def count_in_once_rank_0_wrote(dist, group):
            try:
                c10d._get_default_store().wait(["rank 0 wrote"], datetime.timedelta(seconds=20))
                seen["key"] = True
            except Exception:
                seen["key"] = False
            return count_in(dist, group)

        peers_joined.count_in = count_in_once_rank_0_wrote
    dist.init_process_group("gloo")
    if rank == 0:
        c10d._get_default_store().set("rank 0 wrote", "1")
    return seen.get("key") if rank == WORLD - 1 else None


def test_a_rank_waiting_for_its_peers_leaves_its_store_free(tmp_path):
    results = notebook_launcher(uses_the_store_while_a_peer_joins, args=(str(tmp_path),), num_processes=WORLD,
                                ui="none")
    assert results[WORLD - 1] is True, "rank 0's write waited for rank 2 to join: our thread held its store"
