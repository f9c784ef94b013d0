"""notebook_launcher(..., cluster=RayCluster(...)) on a real two-node Ray cluster (see conftest.py):
the notebook is a Jupyter kernel on node A; ranks are Ray actors on both nodes.

After every scenario nothing of the run may stay on the cluster: no live actor,
no placement group that is not removed, no worker process still carrying a rank.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(600)

SETUP = """
import json, os, time
from notebook_launch import notebook_launcher, RayCluster, LaunchError
HEAD = {head!r}
def cluster(**kw):
    kw.setdefault("placement", "SPREAD")
    return RayCluster(address=HEAD, **kw)
def error_json(err):
    return json.dumps({{"type": type(err).__name__, "message": str(err), "rank": getattr(err, "rank", None),
                       "node_rank": getattr(err, "node_rank", None),
                       "kind": getattr(err, "kind", None), "log_dir": getattr(err, "log_dir", None)}})
"""

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


def assert_nothing_left(ray_nodes, notebook) -> None:
    """No live actor and no placement group of ours in Ray's state, and no process on either
    node still carrying a rank (Ray reports an actor dead slightly before its process exits)."""
    assert notebook.value(LEFTOVERS) == {"actors": 0, "groups": 0}
    deadline = time.monotonic() + 30
    while ray_nodes.rank_processes() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray_nodes.rank_processes() == []


def launch_error(notebook, code: str) -> dict:
    """Run a cell that must raise LaunchError; return what it said (and, as "printed", what the
    cell printed before)."""
    out = notebook.run("try:\n" + "\n".join("    " + line for line in code.strip().splitlines())
                       + "\nexcept LaunchError as err:\n    print(error_json(err))\n"
                       "else:\n    print(json.dumps({'type': None}))")
    assert out["error"] is None, out
    result = json.loads(out["stdout"].strip().splitlines()[-1])
    assert result["type"] == "LaunchError", result
    result["printed"] = out["stdout"]
    return result


def test_four_ranks_on_two_nodes_all_reduce_and_ddp_step(ray_nodes, notebook):
    out = notebook.run("""
import torch, torch.distributed as dist
def train(scale):
    from notebook_launch import progress
    dist.init_process_group("gloo")
    total = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(total)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    model(torch.ones(2, 4) * (dist.get_rank() + 1)).sum().backward()
    grad = model.module.weight.grad.clone()
    for _ in progress(range(5), desc="steps"):
        pass
    print(f"rank {dist.get_rank()} line", flush=True)
    keys = ("RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "WORLD_SIZE", "MASTER_ADDR",
            "MASTER_PORT", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "ACCELERATE_USE_CPU",
            "ACCELERATE_MIXED_PRECISION", "TORCHELASTIC_RUN_ID")
    env = {k: os.environ.get(k) for k in keys}
    import socket, fcntl, struct
    dist.destroy_process_group()
    return {"sum": total.item() * scale, "grad": grad.tolist(), "env": env, "pid": os.getpid()}
results = notebook_launcher(train, args=(10,), num_processes=4, cluster=cluster(), ui="text")
print(json.dumps(results))
""")
    assert out["error"] is None, out
    results = json.loads(out["stdout"].strip().splitlines()[-1])
    assert [r["env"]["RANK"] for r in results] == ["0", "1", "2", "3"]      # global rank order
    assert all(r["sum"] == 60.0 for r in results)                            # all_reduce over both nodes
    assert all(r["grad"] == results[0]["grad"] for r in results)            # DDP averaged the gradients
    envs = [r["env"] for r in results]
    assert {e["WORLD_SIZE"] for e in envs} == {"4"}
    # grouped by node as torchrun does: ranks 0,1 on node 0 and 2,3 on node 1
    assert [(e["NODE_RANK"], e["GROUP_RANK"], e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"]) for e in envs] == [
        ("0", "0", "0", "2"), ("0", "0", "1", "2"), ("1", "1", "0", "2"), ("1", "1", "1", "2")]
    node_of = {0: envs[0]["GLOO_SOCKET_IFNAME"], 1: envs[2]["GLOO_SOCKET_IFNAME"]}
    # gloo and NCCL bind the veth end of each rank's own node (the only interface besides lo)
    assert set(node_of.values()) == set(ray_nodes.links)
    assert all(e["NCCL_SOCKET_IFNAME"] == e["GLOO_SOCKET_IFNAME"] for e in envs)
    rank0_address = ray_nodes.addresses[ray_nodes.links.index(node_of[0])]
    assert {e["MASTER_ADDR"] for e in envs} == {rank0_address}
    assert len({e["MASTER_PORT"] for e in envs}) == 1 and int(envs[0]["MASTER_PORT"]) > 0
    assert {e["ACCELERATE_USE_CPU"] for e in envs} == {"true"}
    assert len({e["TORCHELASTIC_RUN_ID"] for e in envs}) == 1
    # every output line reached the cell tagged with node and rank, and each rank's log has its lines
    for rank in range(4):
        assert f"[node {0 if rank < 2 else 1} rank {rank}] rank {rank} line" in out["stdout"]
    logs_line = re.search(r"logs: (\S+)", out["stdout"])
    assert logs_line, out["stdout"][-2000:]
    log_dir = Path(logs_line.group(1))
    for rank in range(4):
        assert f"rank {rank} line" in (log_dir / f"rank{rank}.log").read_text()
    assert "steps" in out["stdout"] or "4 ranks finished" in out["stdout"]
    assert_nothing_left(ray_nodes, notebook)


def test_failing_rank_on_the_second_node_stops_every_rank(ray_nodes, notebook):
    error = launch_error(notebook, """
def train():
    import socket
    if os.environ["NODE_RANK"] == "1" and os.environ["LOCAL_RANK"] == "1":
        raise ValueError("boom on the second node")
    time.sleep(600)
notebook_launcher(train, num_processes=4, cluster=cluster(), ui="none")
""")
    first = error["message"].splitlines()[0]
    assert error["rank"] == 3 and error["node_rank"] == 1
    assert re.match(r"node 1 \(10\.\d+\.\d+\.\d\), rank 3 failed: ValueError: boom on the second node", first), first
    assert "raise ValueError" in error["message"]           # the rank's traceback
    for rank in (0, 1, 2):                                   # the others were stopped, not left running
        assert re.search(rf"rank {rank} \(node \d \([\d.]+\)\): stopped", error["message"]), error["message"]
    assert_nothing_left(ray_nodes, notebook)


def test_killed_actor_is_a_failure_naming_rank_and_node(ray_nodes, notebook):
    error = launch_error(notebook, """
def train():
    if os.environ["RANK"] == "2":
        os.kill(os.getpid(), 9)            # the actor's worker process dies
    time.sleep(600)
notebook_launcher(train, num_processes=4, cluster=cluster(), ui="none")
""")
    first = error["message"].splitlines()[0]
    assert error["rank"] == 2
    assert re.match(r"node 1 \(10\.\d+\.\d+\.\d\), rank 2 failed: .*Ray actor died", first), first
    assert_nothing_left(ray_nodes, notebook)


def test_timeout_ends_every_actor(ray_nodes, notebook):
    error = launch_error(notebook, """
def train():
    time.sleep(600)
notebook_launcher(train, num_processes=4, cluster=cluster(), timeout=5, ui="none")
""")
    assert error["kind"] == "timeout"
    first = error["message"].splitlines()[0]
    # the verdict where the ranks answered where they are (diagnose.remote_where), else the running ranks
    assert first.startswith("notebook_launch: timed out after 5 s"), first
    if "ranks still running: 0, 1, 2, 3" not in first:
        # Every rank is placed. On a busy machine a rank may still be starting (importing) at 5 s: it
        # is then placed where it is, or said not to have answered; a rank in train() is at its line.
        placed = where_each_rank_is(first)
        assert sorted(placed) == [0, 1, 2, 3], first
        for where in placed.values():
            assert not where.startswith("train()") or where == "train() at Cell In[1], line 3 (time.sleep(600))", first
    assert_nothing_left(ray_nodes, notebook)


def where_each_rank_is(verdict: str) -> dict[int, str]:
    """{rank: where} from a one-line verdict's "rank 1 is in X; ranks 0, 2 are in Y" parts."""
    placed = {}
    for found in re.finditer(r"\branks? ([\d, ]+) (?:is|are) in (.*?)(?=; ranks? \d|$)", verdict):
        for rank in found.group(1).split(","):
            placed[int(rank)] = found.group(2)
    for found in re.finditer(r"\branks? ([\d, ]+) did not say where", verdict):   # still starting: said so
        for rank in found.group(1).split(","):
            placed[int(rank)] = "did not say"
    return placed


def test_interrupt_ends_every_actor(ray_nodes, notebook, tmp_path):
    marker = tmp_path / "started"
    msg_id = notebook.submit(f"""
def train():
    if os.environ["RANK"] == "3":
        open({str(marker)!r}, "w").close()
    time.sleep(600)
try:
    notebook_launcher(train, num_processes=4, cluster=cluster(), ui="none")
except KeyboardInterrupt:
    print(json.dumps("interrupted"))
""")
    deadline = time.monotonic() + 180
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert marker.exists(), "rank 3 never started"
    notebook.km.interrupt_kernel()
    out = notebook.collect(msg_id, timeout=120)
    assert out["error"] is None, out
    assert out["stdout"].strip().splitlines()[-1] == '"interrupted"'
    assert_nothing_left(ray_nodes, notebook)


def test_not_enough_resources_names_what_is_missing(ray_nodes, notebook):
    result = notebook.value("""
try:
    notebook_launcher(print, num_processes=16, cluster=cluster(resources_per_rank={"GPU": 1}), ui="none")
except Exception as err:
    print(json.dumps([type(err).__name__, str(err)]))
""")
    assert result[0] == "GuardError"
    assert "16 ranks x 1 GPU requested; the cluster has 0 GPUs on 2 nodes" in result[1]
    result = notebook.value("""
try:
    notebook_launcher(print, num_processes=3, cluster=cluster(placement="STRICT_SPREAD"), ui="none")
except Exception as err:
    print(json.dumps([type(err).__name__, str(err)]))
""")
    assert result[0] == "GuardError"
    assert "at most one rank per node: 3 ranks requested; the cluster has 2 nodes" in result[1]
    assert_nothing_left(ray_nodes, notebook)


def test_max_restarts_restarts_every_rank(ray_nodes, notebook, tmp_path):
    """Each attempt starts its ranks through the launcher interface (RayLauncher.start, recorded
    here: the ranks that ran are the actors its last start returned; see tests/test_launchers.py)."""
    marker = tmp_path / "failed-once"
    out = notebook.run(f"""
from notebook_launch.engines.ray.launch import RayLauncher
starts, real_start = [], RayLauncher.start
def recording_start(self, plan, job, channels):
    processes = real_start(self, plan, job, channels)
    starts.append([p.pid for p in processes])
    return processes
def train():
    if os.environ["RANK"] == "1" and not os.path.exists({str(marker)!r}):
        open({str(marker)!r}, "w").close()
        raise RuntimeError("first attempt fails")
    return (os.environ["RANK"], os.environ["TORCHELASTIC_RESTART_COUNT"], os.environ["TORCHELASTIC_MAX_RESTARTS"],
            os.getpid())
RayLauncher.start = recording_start
try:
    results = notebook_launcher(train, num_processes=2, cluster=cluster(), max_restarts=2, ui="text")
finally:
    RayLauncher.start = real_start
print(json.dumps({{"results": results, "starts": starts}}))
""")
    assert out["error"] is None, out
    assert "rank 1 failed (RuntimeError: first attempt fails); restarting every rank (restart 1 of 2)" \
        in out["stdout"]
    ran = json.loads(out["stdout"].strip().splitlines()[-1])
    assert [r[:3] for r in ran["results"]] == [[str(r), "1", "2"] for r in range(2)]
    assert len(ran["starts"]) == 2, "one start per attempt"
    assert ran["starts"][-1] == [r[3] for r in ran["results"]]
    assert_nothing_left(ray_nodes, notebook)


def test_widget_panel_in_a_notebook_shows_each_rank_and_its_node(ray_nodes, notebook, node_a_kernel):
    """nbclient runs a real notebook (its kernel on node A); the panel's final picture holds one
    row per rank with its node, bars at their final value, and the tagged lines reach the cell."""
    import nbclient
    import nbformat
    from helpers.nbutil import stop_kernel
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(SETUP.format(head=ray_nodes.head)), nbformat.v4.new_code_cell("""
from notebook_launch import progress
def train(n):
    for i in progress(range(n), desc="train"):
        if i % 100 == 0:
            progress.log(loss=1.0 / (i + 1))
    print("rank", os.environ["RANK"], "finished", flush=True)
    return int(os.environ["RANK"])
notebook_launcher(train, args=(500,), num_processes=4, cluster=cluster())
""")]
    client = nbclient.NotebookClient(nb, km=node_a_kernel, timeout=300, store_widget_state=True, allow_errors=True)
    try:
        client.execute(env=ray_nodes.env, cwd=str(ray_nodes.tmp))
    finally:
        stop_kernel(client, node_a_kernel)
    cell = nb.cells[1]
    errors = [o for o in cell.outputs if o.output_type == "error"]
    assert not errors, "\n".join(errors[0].traceback)
    assert any("[0, 1, 2, 3]" in o.get("data", {}).get("text/plain", "") for o in cell.outputs)
    # the panel ended as a picture of its final state (display/widget.py): static HTML, no widget view
    assert not [o for o in cell.outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    pictures = [o for o in cell.outputs if o.output_type == "display_data"
                and "nl-panel" in o.data.get("text/html", "")]
    assert len(pictures) == 1
    summary = pictures[0].data["text/plain"]
    nodes = [ray_nodes.addresses.index(m) for m in re.findall(r"rank \d \[cpu on node \d \(([\d.]+)\)\] done", summary)]
    assert len(nodes) == 4 and set(nodes) == {0, 1}, summary
    for rank in range(4):
        assert re.search(rf"rank {rank} \[cpu on node \d \([\d.]+\)\] done train: 100% 500/500", summary), summary
    page = pictures[0].data["text/html"]
    assert page.count("nl-status-done") == 4 and page.count("width:100.0%") == 4, page
    assert len(re.findall(r"cpu on node \d \(10\.[\d.]+\)", page)) >= 4 and "loss=" in page
    streamed = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
    for rank in range(4):
        assert re.search(rf"\[node \d rank {rank}\] rank {rank} finished", streamed), streamed
    assert_nothing_left(ray_nodes, notebook)


def test_input_in_a_rank_on_the_other_node_is_answered_from_the_notebook(ray_nodes, notebook):
    """input() in a rank asks the notebook's frontend; the answer travels back over the rank's
    answers connection."""
    msg_id = notebook.submit("""
def ask():
    if os.environ["RANK"] == "3":
        return input("value for rank 3? ")
print(json.dumps(notebook_launcher(ask, num_processes=4, cluster=cluster(), ui="none")))
""")
    request = notebook.kc.get_stdin_msg(timeout=240)
    assert request["msg_type"] == "input_request" and "value for rank 3?" in request["content"]["prompt"]
    notebook.kc.input("forty-two")
    out = notebook.collect(msg_id, timeout=240)
    assert out["error"] is None, out
    assert json.loads(out["stdout"].strip().splitlines()[-1]) == [None, None, None, "forty-two"]
    assert_nothing_left(ray_nodes, notebook)


def test_busy_cluster_waits_then_says_what_is_missing(ray_nodes, notebook):
    """Enough CPUs in total, but another job holds them: the launch waits (the panel says so)
    and ends with a clear error after rdzv_timeout, leaving nothing behind."""
    error = launch_error(notebook, """
from ray.util.placement_group import placement_group, remove_placement_group
holder = placement_group([{"CPU": 2}], strategy="PACK")
ray.get(holder.ready())
try:
    notebook_launcher(print, num_processes=4, cluster=cluster(), rdzv_timeout=5, ui="text")
finally:
    remove_placement_group(holder)
""")
    assert error["kind"] == "rendezvous"
    assert "could not place 4 ranks" in error["message"] and "4 CPU requested, 2 free" in error["message"]
    # the panel (here the text display's final summary) showed each rank waiting for its placement
    for rank in range(4):
        assert f"rank {rank} [cpu] starting | waiting for Ray to place 4 ranks x {{'CPU': 1.0}} (SPREAD)" \
            in error["printed"], error["printed"]
    assert_nothing_left(ray_nodes, notebook)


def test_env_reports_the_ray_cluster(ray_nodes):
    """`notebook-launch env` on node A, with RAY_ADDRESS naming the head, reports the cluster."""
    env = dict(ray_nodes.env, RAY_ADDRESS=ray_nodes.head)
    out = subprocess.run(["ip", "netns", "exec", ray_nodes.namespaces[0], sys.executable, "-m", "notebook_launch",
                          "env"], env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    line = next(line for line in out.stdout.splitlines() if line.startswith("ray:"))
    assert re.search(rf"ray 2\.\d+\.\d+; cluster at {re.escape(ray_nodes.addresses[0])}: 2 nodes, 4 CPUs, 0 GPUs "
                     r"\(10\.[\d.]+: 2 CPU; 10\.[\d.]+: 2 CPU\)", line), line


def test_lost_node_stops_every_rank_and_names_it(ray_nodes, notebook, tmp_path):
    """Every process of one node dies at once (raylet, workers): the ranks there are reported as
    lost with their node, the others are stopped. Last in this module: the node stays down."""
    started = tmp_path / "started"
    started.mkdir()
    msg_id = notebook.submit(f"""
def train():
    open(os.path.join({str(started)!r}, os.environ["RANK"]), "w").close()
    time.sleep(600)
try:
    notebook_launcher(train, num_processes=4, cluster=cluster(), ui="none")
except LaunchError as err:
    print(error_json(err))
""")
    deadline = time.monotonic() + 240
    while len(list(started.iterdir())) < 4 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(list(started.iterdir())) == 4, "the ranks never all started"
    ray_nodes.kill_node(1)
    out = notebook.collect(msg_id, timeout=300)
    assert out["error"] is None, out
    error = json.loads(out["stdout"].strip().splitlines()[-1])
    first = error["message"].splitlines()[0]
    lost = re.escape(ray_nodes.addresses[1])
    # Ray says "node died" once its health checks noticed, "unreachable" when the call broke first
    assert re.match(rf"node \d \({lost}\), rank \d failed: its Ray actor (died because its node died|is "
                    r"unreachable \(its worker process or its node went away\))", first), first
    survivors = re.findall(rf"rank (\d) \(node \d \({re.escape(ray_nodes.addresses[0])}\)\): stopped", error["message"])
    assert len(survivors) == 2, error["message"]
    assert_nothing_left(ray_nodes, notebook)
