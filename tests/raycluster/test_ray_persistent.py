"""start_ranks(n, cluster=RayCluster(...)): persistent ranks as Ray actors on a real two-node
Ray cluster (see conftest.py); the notebook is a Jupyter kernel on node A.

One cluster for the module (it takes a while to start); each test leaves nothing of its ranks
on the cluster (no live rank actor, no placement group that is not removed, no worker process
carrying a rank), which the next one checks before it starts. The lost-node test is last: it
kills node B.
"""
from __future__ import annotations

import json
import re
import signal
import time

import pytest

pytestmark = pytest.mark.timeout(900)

SETUP = """
import json, os, time
from notebook_launch import RayCluster, LaunchError, notebook_launcher, start_ranks
HEAD = {head!r}
def cluster(**kw):
    kw.setdefault("placement", "SPREAD")
    return RayCluster(address=HEAD, **kw)
def error_json(err):
    return json.dumps({{"type": type(err).__name__, "message": str(err), "rank": getattr(err, "rank", None),
                       "kind": getattr(err, "kind", None)}})
"""

# Ray's own tables, read from its control store (ray.util.state needs the dashboard, which the
# test cluster leaves off to fit the machine)
LEFTOVERS = """
import json, ray
from ray.util.placement_group import placement_group_table
actors = [a for a in ray._private.state.actors().values()
          if a["State"] != "DEAD" and "RankActor" in a.get("ActorClassName", "")]
groups = [g for g in placement_group_table().values() if g["state"] != "REMOVED"]
print(json.dumps({"actors": len(actors), "groups": len(groups)}))
"""


@pytest.fixture(scope="module")
def notebook(ray_nodes):
    ray_nodes.notebook.value(SETUP.format(head=ray_nodes.head) + "\nprint(json.dumps(True))")
    return ray_nodes.notebook


def leftovers(notebook) -> dict:
    return notebook.value(LEFTOVERS)


def assert_nothing_left(ray_nodes, notebook, wait: float = 0) -> None:
    """No live rank actor and no placement group (ray.util.state), and no process on either node
    still carrying a rank. ``wait``: seconds Ray may take to notice (a driver that died)."""
    deadline = time.monotonic() + wait
    found = leftovers(notebook)
    while found != {"actors": 0, "groups": 0} and time.monotonic() < deadline:
        time.sleep(1)
        found = leftovers(notebook)
    assert found == {"actors": 0, "groups": 0}
    deadline = time.monotonic() + 30 + wait
    while ray_nodes.rank_processes() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray_nodes.rank_processes() == []


def launch_error(notebook, code: str) -> dict:
    """Run a cell that must raise LaunchError; what it said (and, as "printed", the cell's output)."""
    out = notebook.run("try:\n" + "\n".join("    " + line for line in code.strip().splitlines())
                       + "\nexcept LaunchError as err:\n    print(error_json(err))\n"
                       "else:\n    print(json.dumps({'type': None}))")
    assert out["error"] is None, out
    result = json.loads(out["stdout"].strip().splitlines()[-1])
    assert result["type"] == "LaunchError", (result, out["stdout"])
    result["printed"] = out["stdout"]
    return result


def test_state_lives_across_calls_on_four_ranks_over_two_nodes(ray_nodes, notebook):
    """A process group and a model made in one call are used by the next; push/pull; a rank's
    error shows its traceback and leaves every rank alive with its state; a timed-out call is
    interrupted and the ranks keep their state; close() leaves nothing on the cluster."""
    out = notebook.run("""
ranks = start_ranks(4, cluster=cluster(), ui="text")
def setup():
    global model, calls
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    calls = 1
    print(f"set up on {os.environ['NODE_RANK']}", flush=True)
    return os.getpid()
first = ranks.run(setup)
print(json.dumps({"pids": first, "nodes": ranks.nodes}))
""")
    assert out["error"] is None, out
    first = json.loads(out["stdout"].strip().splitlines()[-1])
    assert "ray, persistent" in out["stdout"]
    assert re.search(r"rank 0 on node 0 \(10\.[\d.]+\), rank 1 on node 0 .*rank 3 on node 1", out["stdout"]), \
        out["stdout"]
    assert "[node 1 rank 3] set up on 1" in out["stdout"]
    addresses = {n.split("(")[1].rstrip(")") for n in first["nodes"]}
    assert addresses == set(ray_nodes.addresses)            # two ranks on each node

    second = notebook.value("""
def step(scale):
    global calls
    import torch, torch.distributed as dist
    calls += 1
    total = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(total)                      # the group made by the first call
    model(torch.ones(2, 4)).sum().backward()
    return {"pid": os.getpid(), "sum": total.item() * scale, "calls": calls,
            "weight": model.weight.detach().tolist()}
print(json.dumps(ranks.run(step, args=(10,))))
""")
    assert [r["pid"] for r in second] == first["pids"]       # the same actors' processes
    assert all(r["sum"] == 60.0 and r["calls"] == 2 for r in second)
    assert all(r["weight"] == second[0]["weight"] for r in second)

    pushed = notebook.value("""
import torch
ranks.push(offset=torch.arange(3.0))
def use():
    global calls
    calls += 1
    return (offset * int(os.environ["RANK"])).tolist()
print(json.dumps([ranks.run(use), ranks.pull("calls")]))
""")
    assert pushed == [[[0.0, r * 1.0, r * 2.0] for r in range(4)], [3, 3, 3, 3]]

    error = launch_error(notebook, """
def fails():
    if os.environ["RANK"] == "2":
        raise ValueError("bad batch on rank two")
    return "ok"
ranks.run(fails)
""")
    assert error["rank"] == 2 and error["kind"] == "exception"
    first_line = error["message"].splitlines()[0]
    assert re.match(r"node 1 \(10\.[\d.]+\), rank 2 failed: ValueError: bad batch on rank two", first_line), \
        first_line
    assert "Traceback from rank 2:" in error["message"]                 # the rank's traceback, down to
    assert re.search(r"line \d+, in fails\n", error["message"]), error["message"]   # the cell's function
    assert "still running, with their state" in error["message"]

    error = launch_error(notebook, """
def hangs():
    time.sleep(600)
ranks.run(hangs, timeout=3)
""")
    assert error["kind"] == "timeout"
    assert "timed out after 3 s" in error["message"]
    assert "still running, with their state" in error["message"]

    after = notebook.value("""
def count():
    return calls
print(json.dumps([ranks.run(count), ranks.alive, [p for p in ranks.pids] == first]))
""".replace("first]", "%s]" % first["pids"]))
    assert after == [[3, 3, 3, 3], True, True]

    notebook.value("ranks.close()\nprint(json.dumps(ranks.closed))")
    assert_nothing_left(ray_nodes, notebook)


def test_magics_with_cluster_in_a_real_kernel(ray_nodes, notebook):
    """%ranks start --cluster, a %%ranks cell whose value is shown per rank, push/pull, stop."""
    out = notebook.run(f"%load_ext notebook_launch\n%ranks start -n 4 --cluster {ray_nodes.head} --ui text")
    assert out["error"] is None, out
    assert "ray, persistent" in out["stdout"], out["stdout"]
    out = notebook.run("%%ranks\nimport os\nmine = int(os.environ['RANK']) * 7\nos.environ['NODE_RANK']")
    assert out["error"] is None, out
    shown = " ".join(d.get("data", {}).get("text/plain", "") for d in out["displays"]) + out["stdout"]
    assert re.search(r"\[rank 3\]\s*'1'", shown), shown       # rank 3 is on node 1
    assert re.search(r"\[rank 0\]\s*'0'", shown), shown
    pulled = notebook.value("print(json.dumps(get_ipython().run_line_magic('ranks', 'pull mine')))")
    assert pulled == [0, 7, 14, 21]
    out = notebook.run("%ranks stop")
    assert out["error"] is None, out
    assert_nothing_left(ray_nodes, notebook)


def test_kernel_killed_with_ranks_alive_leaves_nothing_on_the_cluster(ray_nodes, notebook, tmp_path):
    """The notebook's kernel dies (SIGKILL) while its ranks hold state: Ray ends the actors the
    dead driver owned and removes its placement group; the ranks also exit on their own when
    their connection to the notebook ends."""
    from ray_two_nodes import Notebook
    doomed = Notebook(ray_nodes.namespaces[0], ray_nodes.env, tmp_path)
    try:
        pids = doomed.value(SETUP.format(head=ray_nodes.head) + """
ranks = start_ranks(4, cluster=cluster(resources_per_rank={"CPU": 0.5}), ui="none")
def keep():
    global kept
    kept = [0] * 1000
    return os.getpid()
pids = ranks.run(keep)
# a launch from the same notebook while the ranks live (its own placement group beside theirs)
assert notebook_launcher(keep, num_processes=2, cluster=cluster(), ui="none") != pids[:2]
print(json.dumps(ranks.run(keep)))
""")
        assert len(set(pids)) == 4
        assert leftovers(notebook) == {"actors": 4, "groups": 1}
        doomed.km.signal_kernel(signal.SIGKILL)   # no shutdown, no atexit: the process is gone
    finally:
        doomed.shutdown()
    assert_nothing_left(ray_nodes, notebook, wait=120)


def test_node_lost_between_calls_is_a_launch_error_and_the_next_call_restarts(ray_nodes, notebook):
    """Last in the module: node B stays down. The rank on node B is lost with its node between
    calls: the next call is a LaunchError naming it and its node, and every rank is stopped; the
    call after that starts fresh ranks (on node A, the one left) and says so. Both starts go
    through the launcher interface (RayLauncher.start, recorded here: the ranks that run are the
    actors its last start returned; see tests/test_launchers.py)."""
    nodes = notebook.value("""
from notebook_launch.engines.ray.launch import RayLauncher
starts, real_start = [], RayLauncher.start
def recording_start(self, plan, job, channels):
    processes = real_start(self, plan, job, channels)
    starts.append([self.persistent, [p.pid for p in processes]])
    return processes
RayLauncher.start = recording_start
ranks = start_ranks(2, cluster=cluster(), ui="none")
def keep():
    global kept
    kept = int(os.environ["RANK"])
    return kept
assert ranks.run(keep) == [0, 1]
assert starts == [[True, ranks.pids]], (starts, ranks.pids)
print(json.dumps(ranks.nodes))
""")
    lost_address = ray_nodes.addresses[1]            # node B (node A holds the notebook and the head)
    lost = [rank for rank, node in enumerate(nodes) if node.endswith(f"({lost_address})")]
    assert len(lost) == 1, nodes                     # SPREAD: one rank on each node
    lost_node = re.escape(nodes[lost[0]])
    ray_nodes.kill_node(1)
    notebook.value("""
import ray
deadline = time.monotonic() + 180
while any(n["Alive"] for n in ray.nodes() if n["NodeManagerAddress"] == %r) and time.monotonic() < deadline:
    time.sleep(0.5)
print(json.dumps(True))
""" % lost_address)
    error = launch_error(notebook, "ranks.run(lambda: kept)")
    first = error["message"].splitlines()[0]
    # noticed between calls, or (if Ray reported the actor dead only once the call was sent) by the call
    assert re.search(rf"rank {lost[0]} \({lost_node}\) was lost between calls: its Ray actor "
                     rf"(died because its node died|is unreachable)|{lost_node}, rank {lost[0]} failed: its Ray actor",
                     first), first
    assert "next call starts fresh ranks" in error["message"], error["message"]
    out = notebook.run("""
def fresh():
    return [os.environ["RANK"], "kept" in globals()]
print(json.dumps(ranks.run(fresh)))
""")
    assert out["error"] is None, out
    assert "the ranks were restarted because" in out["stdout"], out["stdout"]
    assert json.loads(out["stdout"].strip().splitlines()[-1]) == [["0", False], ["1", False]]
    restarted = notebook.value("""
RayLauncher.start = real_start
print(json.dumps([len(starts), starts[-1] == [True, ranks.pids]]))
""")
    assert restarted == [2, True]   # one start each time the ranks started, the last the ranks' own
    notebook.value("ranks.close()\nprint(json.dumps(True))")
    assert_nothing_left(ray_nodes, notebook)
