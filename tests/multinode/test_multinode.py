"""Multi-node launches between two network namespaces (see conftest.py)."""
import inspect
import os
import signal
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(240)


def _clean_exit(outcome):
    assert outcome["handlers_restored"], "signal handlers were not restored"
    assert outcome["children_left"] == [], f"processes left behind: {outcome['children_left']}"
    assert outcome["fds_left"] == [], f"file descriptors left open: {outcome['fds_left']}"


@pytest.mark.parametrize("rdzv_backend", ["static", "c10d"])
def test_four_rank_all_reduce_across_two_nodes(two_nodes, rdzv_backend):
    node0, node1 = two_nodes.run("allreduce", rdzv_backend=rdzv_backend)
    for node_rank, outcome in enumerate((node0, node1)):
        assert outcome["ok"], outcome.get("message")
        results = outcome["results"]
        assert [r["rank"] for r in results] == [2 * node_rank, 2 * node_rank + 1]
        assert [r["local_rank"] for r in results] == [0, 1]
        assert all(r["world_size"] == 4 and r["node_rank"] == node_rank for r in results)
        assert all(r["sum"] == 1 + 2 + 3 + 4 for r in results)
        # gloo was pointed at the veth link, not at loopback (the hostname resolves to 127.0.0.1)
        assert all(r["gloo_ifname"] == two_nodes.links[node_rank] for r in results)
        assert all(r["nccl_ifname"] == two_nodes.links[node_rank] for r in results)
        assert f"[rank {2 * node_rank}] rank {2 * node_rank} of 4: sum 10" in outcome["printed"]
        _clean_exit(outcome)


def test_each_nodes_ranks_show_their_resources_read_by_that_node(two_nodes):
    """An elastic node's ranks are local to its own launcher, which reads their /proc (issue 34
    item 1): every rank's row on its node's panel, and the final picture, show its CPU and memory,
    and no rank samples itself (that is for ranks no notebook can read: Ray, SLURM)."""
    node0, node1 = two_nodes.run("resources")
    for node_rank, outcome in enumerate((node0, node1)):
        assert outcome["ok"], outcome.get("message")
        assert [r["self_sampling"] for r in outcome["results"]] == [False, False]
        for rank in (2 * node_rank, 2 * node_rank + 1):
            row = [line for line in outcome["printed"].splitlines() if line.strip().startswith(f"rank {rank} ")]
            assert row and "[avg cpu " in row[-1] and " own of " in row[-1], outcome["printed"]
        _clean_exit(outcome)


def test_rank_failure_on_node_1_ends_both_nodes(two_nodes):
    node0, node1 = two_nodes.run("fail")
    for outcome in (node0, node1):
        assert not outcome["ok"]
        assert (outcome["rank"], outcome["error_node"], outcome["exc_type"]) == (3, 1, "ValueError")
        first_line = outcome["message"].splitlines()[0]
        assert first_line == "node 1, rank 3 failed: ValueError: boom on rank 3"
        assert 'raise ValueError("boom on rank 3")' in outcome["message"]
        assert outcome["seconds"] < 60, "the surviving ranks sleep 120 s: they were not stopped"
        _clean_exit(outcome)
    assert "Ranks on this node (node 0):" in node0["message"]
    assert "stopped by notebook_launch" in node0["message"]


@pytest.mark.parametrize("rdzv_backend", ["static", "c10d"])
def test_restart_recovers_from_one_injected_failure(two_nodes, rdzv_backend):
    node0, node1 = two_nodes.run("restart", max_restarts=1, rdzv_backend=rdzv_backend)
    for node_rank, outcome in enumerate((node0, node1)):
        assert outcome["ok"], outcome.get("message")
        assert [r["attempt"] for r in outcome["results"]] == [1, 1]
        assert [r["rank"] for r in outcome["results"]] == [2 * node_rank, 2 * node_rank + 1]
        assert all(r["sum"] == 10 for r in outcome["results"])
        assert ("node 1, rank 3 failed (ValueError: injected failure on attempt 0); "
                "restarting every rank (restart 1 of 1)") in outcome["printed"]
        _clean_exit(outcome)


def test_missing_node_times_out_with_a_clear_error(two_nodes):
    # Both at once, on different ports, so that each waits for a partner that never comes:
    # node 0 hosts the rendezvous and waits for node 1; node 1 waits for a host that never opens.
    procs = [two_nodes.start(0, "allreduce", rdzv_timeout=3, port=two_nodes.port),
             two_nodes.start(1, "allreduce", rdzv_timeout=3, port=two_nodes.port + 1)]
    node0, node1 = (two_nodes.finish(p) for p in procs)
    assert not node0["ok"] and node0["kind"] == "rendezvous"
    assert "timed out after 3 s (rdzv_timeout): node 1 never arrived" in node0["message"]
    _clean_exit(node0)
    assert not node1["ok"] and node1["kind"] == "rendezvous"
    assert "no node opened the rendezvous" in node1["message"] and "within 3 s" in node1["message"]
    _clean_exit(node1)


def test_interrupting_one_node_stops_the_other(two_nodes):
    procs = [two_nodes.start(n, "sleep") for n in (0, 1)]
    deadline = time.monotonic() + 90
    while not all("sum 10" in Path(p.log_path).read_text() for p in procs):
        assert time.monotonic() < deadline, "the ranks never started"
        assert all(p.poll() is None for p in procs), "a node ended early"
        time.sleep(0.2)
    os.kill(procs[0].pid, signal.SIGINT)   # what Jupyter's interrupt does to node 0's kernel
    node0, node1 = (two_nodes.finish(p) for p in procs)
    assert node0.get("interrupted") and "interrupted" in node0["message"]
    assert not node1["ok"] and node1["kind"] == "interrupted" and node1["error_node"] == 0
    assert node1["message"].splitlines()[0] == \
        "node 0: was interrupted (KeyboardInterrupt or the Stop button)"
    for outcome in (node0, node1):
        assert outcome["seconds"] < 60, "the ranks sleep 120 s: they were not stopped"
        _clean_exit(outcome)


def test_a_hang_across_nodes_gets_one_verdict_over_every_rank(two_nodes):
    """Rank 3 (node 1) skips an all_reduce: the timeout's verdict names it, with where it is, from
    whichever node reports it; ranks 0-2 (two nodes) wait in the all_reduce."""
    import node_script
    lines, first = inspect.getsourcelines(node_script.train)
    sleep = first + next(i for i, line in enumerate(lines) if "time.sleep(120.0)" in line)
    reduce = first + next(i for i, line in enumerate(lines) if "dist.all_reduce(torch.ones(1))" in line)
    verdict = (f"ranks 0, 1, 2 wait in all_reduce #2 (node_script.py:{reduce}); rank 3 never reached it: "
               f"it is in train() at node_script.py:{sleep} (time.sleep(120.0))")
    node0, node1 = two_nodes.run("hang", timeout=25)
    for outcome in (node0, node1):
        assert not outcome["ok"] and outcome["kind"] == "timeout", outcome["message"]
        assert verdict in outcome["message"].splitlines()[0], outcome["message"]
        assert outcome["seconds"] < 100, "the ranks sleep 120 s: they were not stopped"
        _clean_exit(outcome)
    # every node's error carries the detail: the reporting node's own, the other's from its failure record
    assert all("Where each rank was:" in outcome["message"] for outcome in (node0, node1)), (node0, node1)
    # the node that diagnosed the hang; the other's error is the record it posted ("node N has its own" logs)
    reporting = node1 if "has its own)" in node0["message"] else node0
    assert "has its own)" not in reporting["message"], (node0, node1)
    detail = reporting["message"][reporting["message"].index("Where each rank was:"):]
    other = 1 if reporting is node0 else 0
    # the other node's ranks are there, said to be its own, with their stacks and source lines
    for rank in (2 * other, 2 * other + 1):
        assert f"rank {rank}:\n  on node {other}\n" in detail, detail
    assert "time.sleep(120.0)" in detail[detail.index("rank 3:"):]


def test_whereabouts_cross_nodes_with_cell_labels_and_source_lines():
    """What a node posts on the board comes back on another node with the sending node's cell
    labels and source lines, since the receiving node has neither its cells nor its files."""
    import linecache

    from notebook_launch.engines.elastic.node_board import decode_whereabouts, encode_whereabouts
    from notebook_launch.diagnose.hang_verdict import (Collective, Frame, RankWhereabouts, ThreadStack, detail,
                                                        verdict)
    cell = "/tmp/ipykernel_4242/1234567.py"   # a cell file of the sending node's kernel
    linecache.cache[cell] = (40, None, ["import time\n", "def evaluate():\n", "    time.sleep(600)\n"], cell)
    try:
        sent = [RankWhereabouts(3, last=Collective("all_reduce", "default group", 56, "(4,) float32",
                                                    Frame(cell, 2, "evaluate")),
                                threads=[ThreadStack(7, False, [Frame(cell, 3, "evaluate")])], main_thread=7)]
        data = encode_whereabouts(sent, lambda f: "Cell In[5]" if f == cell else None)
    finally:
        del linecache.cache[cell]
    [got] = decode_whereabouts(data, node=1)
    assert got.rank == 3 and got.note == "on node 1" and got.main_thread == 7
    assert got.threads[0].frames == [Frame("node 1 Cell In[5]", 3, "evaluate")]
    here = [RankWhereabouts(0, inside=Collective("all_reduce", "default group", 57, "(4,) float32",
                                                 Frame("train.py", 9, "train")))]
    line = verdict(here + [got], lambda f: None)
    assert line == ("rank 0 waits in all_reduce #57 (train.py:9); rank 3 never reached it: "
                    "it is in evaluate() at node 1 Cell In[5]:3 (time.sleep(600))")
    assert "rank 3:\n  on node 1\n" in detail(here + [got], lambda f: None)
