"""The XLA backend on real torch_xla: PJRT_DEVICE=CPU with CPU_NUM_DEVICES=2 runs
two ordinals as two threads of one process, the layout of one TPU v2/v3 chip.

Runs only in .venv-xla (``bash scripts/test-xla.sh``): torch_xla 2.9.0 needs
torch 2.9.0, which cannot share .venv with torch 2.13. Elsewhere it is skipped.
"""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

torch_xla = pytest.importorskip("torch_xla", reason="torch_xla is not installed: run bash scripts/test-xla.sh")
import psutil  # noqa: E402
import torch  # noqa: E402

from notebook_launch import GuardError, LaunchArgumentError, LaunchError, notebook_launcher  # noqa: E402
from notebook_launch.display.base import Display  # noqa: E402

# CPU PJRT runs a 2-device collective reliably only when the threads do not
# compile and run their graphs at the same time (FIELD_NOTES).
SYNC_LOCK = threading.Lock()
KAGGLE_ADDRESSES = "local:8476,local:8477,local:8478,local:8479"


@pytest.fixture(autouse=True)
def two_cpu_xla_devices(monkeypatch):
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    monkeypatch.setenv("CPU_NUM_DEVICES", "2")
    yield
    leftover = [p for p in psutil.Process().children(recursive=True) if p.is_running()
                and p.status() != psutil.STATUS_ZOMBIE]
    assert not leftover, f"processes left behind by the launch: {leftover}"


def launch(fn, *args, tmp_path, **kwargs):
    kwargs.setdefault("timeout", 240)
    kwargs.setdefault("ui", "none")
    return notebook_launcher(fn, args=args, log_dir=str(tmp_path / "logs"), **kwargs)


def ordinal_and_tensor(scale):
    import torch_xla.runtime as xr
    ordinal = xr.global_ordinal()
    t = torch.arange(3.0, device=torch_xla.device()) * (ordinal + 1) * scale
    return {"ordinal": ordinal, "world": xr.world_size(), "tensor": t, "pid": os.getpid(),
            "thread": threading.get_ident()}


def test_every_ordinal_returns_its_result(tmp_path):
    results = launch(ordinal_and_tensor, 2.0, tmp_path=tmp_path)
    assert [r["ordinal"] for r in results] == [0, 1]
    assert [r["world"] for r in results] == [2, 2]
    assert torch.equal(results[0]["tensor"], torch.tensor([0.0, 2.0, 4.0]))
    assert torch.equal(results[1]["tensor"], torch.tensor([0.0, 4.0, 8.0]))
    assert results[0]["tensor"].device.type == "cpu"   # moved off XLA before pickling
    # two threads of one process: the layout of a TPU v2/v3 chip
    assert results[0]["pid"] == results[1]["pid"] != os.getpid()
    assert results[0]["thread"] != results[1]["thread"]


def environment_seen():
    import torch_xla.runtime as xr
    keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
            "NOTEBOOK_LAUNCH_RANK", "TPU_PROCESS_ADDRESSES", "CLOUD_TPU_TASK_ID", "ACCELERATE_USE_CPU")
    return {"ordinal": xr.global_ordinal(), **{k: os.environ.get(k) for k in keys}}


def test_environment_of_each_ordinal_and_kaggle_variables_dropped(tmp_path, monkeypatch):
    monkeypatch.setenv("TPU_PROCESS_ADDRESSES", KAGGLE_ADDRESSES)   # as Kaggle's TPU VM leaves them
    monkeypatch.setenv("CLOUD_TPU_TASK_ID", "0")
    before = dict(os.environ)
    results = launch(environment_seen, tmp_path=tmp_path)
    for ordinal, env in enumerate(results):
        assert env["ordinal"] == ordinal
        assert env["WORLD_SIZE"] == "2" and env["LOCAL_WORLD_SIZE"] == "2"
        assert env["MASTER_ADDR"] == "127.0.0.1" and env["MASTER_PORT"]
        assert env["NOTEBOOK_LAUNCH_RANK"] is not None            # nested launches are refused
        assert env["TPU_PROCESS_ADDRESSES"] is None and env["CLOUD_TPU_TASK_ID"] is None
        assert env["ACCELERATE_USE_CPU"] is None                   # Accelerate must pick XLA
        # threads share os.environ: no variable can name one thread's rank
        assert env["RANK"] is None and env["LOCAL_RANK"] is None
    assert dict(os.environ) == before   # the notebook's environment is untouched


def test_a_process_with_one_ordinal_gets_rank_variables(tmp_path, monkeypatch):
    monkeypatch.setenv("CPU_NUM_DEVICES", "1")   # xmp.spawn(nprocs=1)
    [env] = launch(environment_seen, tmp_path=tmp_path)
    assert (env["ordinal"], env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"]) == (0, "0", "0", "1")


def write_marker(marker):
    """Tell the test this replica runs, and where: its pid and process group."""
    with open(marker + ".tmp", "w") as f:
        f.write(f"{os.getpid()} {os.getpgrp()}")
    os.replace(marker + ".tmp", marker)


def group_members(pgid):
    alive = []
    for proc in psutil.process_iter(["status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                alive.append(proc.pid)
        except (ProcessLookupError, psutil.Error):
            pass
    return alive


def assert_replicas_gone(marker):
    """Every process of the launcher's group is gone (replica processes orphaned by a killed
    launcher would not show up as our children, so look at the group)."""
    _, pgid = map(int, marker.read_text().split())
    assert pgid != os.getpgrp()   # replicas run in the launcher's own group
    for _ in range(600):          # a killed orphan is reaped by init; give it time
        if not group_members(pgid):
            return
        time.sleep(0.1)
    pytest.fail(f"replica processes of group {pgid} still alive: {group_members(pgid)}")


def fail_on_ordinal_1(marker):
    import torch_xla.runtime as xr
    if xr.global_ordinal() == 1:
        for _ in range(1200):   # fail once ordinal 0 is surely running
            if os.path.exists(marker):
                break
            time.sleep(0.1)
        raise ValueError("ordinal 1 cannot go on")
    write_marker(marker)
    for _ in range(2400):   # would run 4 minutes if nobody stopped it
        time.sleep(0.1)
    return "not stopped"


def test_a_failing_ordinal_stops_the_others_and_shows_its_traceback(tmp_path):
    marker = tmp_path / "rank0-started"
    with pytest.raises(LaunchError) as err:
        launch(fail_on_ordinal_1, str(marker), tmp_path=tmp_path)
    error = err.value
    assert error.rank == 1 and error.kind == "exception" and error.exc_type == "ValueError"
    message = str(error)
    assert message.startswith("rank 1 failed: ValueError: ordinal 1 cannot go on")
    assert 'raise ValueError("ordinal 1 cannot go on")' in message     # the replica's own traceback
    assert "rank 0: stopped by notebook_launch" in message
    assert error.results == [None, None]
    assert_replicas_gone(marker)


def print_from_each_ordinal():
    import torch_xla.runtime as xr
    ordinal = xr.global_ordinal()
    for i in range(3):
        print(f"line {i} of ordinal {ordinal}")
    print(f"warning of ordinal {ordinal}", file=sys.stderr)
    return ordinal


def test_output_of_each_ordinal_is_its_ranks(tmp_path):
    assert launch(print_from_each_ordinal, tmp_path=tmp_path) == [0, 1]
    for ordinal in (0, 1):
        log = (tmp_path / "logs" / f"rank{ordinal}.log").read_text()
        assert [f"line {i} of ordinal {ordinal}" for i in range(3)] == [
            line for line in log.splitlines() if line.startswith("line ")]
        assert f"[stderr] warning of ordinal {ordinal}" in log
        assert f"of ordinal {1 - ordinal}" not in log


def all_reduce_ordinals():
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr
    t = torch.tensor([float(xr.global_ordinal() + 1)], device=torch_xla.device())
    total = xm.all_reduce(xm.REDUCE_SUM, t)
    with SYNC_LOCK:
        torch_xla.sync()
    return total.cpu().item()


def test_ordinals_reduce_together(tmp_path):
    assert launch(all_reduce_ordinals, tmp_path=tmp_path) == [3.0, 3.0]


def accelerator_view():
    from accelerate import Accelerator
    accelerator = Accelerator()
    return {"type": accelerator.distributed_type.value, "num_processes": accelerator.num_processes,
            "process_index": accelerator.process_index, "device": accelerator.device.type,
            "main": accelerator.is_main_process}


def test_accelerate_inside_a_replica_sees_xla(tmp_path):
    import accelerate.state
    results = launch(accelerator_view, tmp_path=tmp_path)
    assert results == [
        {"type": "XLA", "num_processes": 2, "process_index": 0, "device": "xla", "main": True},
        {"type": "XLA", "num_processes": 2, "process_index": 1, "device": "xla", "main": False}]
    assert not accelerate.state.PartialState._shared_state   # the notebook holds no state


def test_num_processes_pjrt_cannot_run_is_refused_before_starting(tmp_path):
    with pytest.raises(LaunchArgumentError, match=r"num_processes=None or 2.*num_processes=1"):
        launch(ordinal_and_tensor, 1.0, tmp_path=tmp_path, num_processes=3)


def test_planned_ranks_that_torch_xla_does_not_run_are_reported(tmp_path):
    """When detection guessed wrong (here: 3 planned, 2 devices), rank 0 says so."""
    from notebook_launch.scaffold import run as run_module
    from notebook_launch.planning.net import free_port
    from notebook_launch.planning.options import launch_options
    from notebook_launch.wire.plan import build_plan
    from notebook_launch.engines import launcher_for
    from notebook_launch.rank.runner import Job
    plan = build_plan(num_processes=3, num_nodes=1, node_rank=0, master_addr="127.0.0.1",
                      master_port=free_port(), device_kind="xla", mixed_precision="no",
                      start_method="xla", run_id="mismatch")
    options = launch_options(function=ordinal_and_tensor, args=(1.0,), num_processes=3, start_method="xla",
                             log_dir=str(tmp_path / "logs"), ui="none", timeout=240)
    with pytest.raises(LaunchError) as err:
        run_module.run_plan(plan, Job(ordinal_and_tensor, (1.0,)), options, run_id="mismatch",
                            launcher=launcher_for("xla"))
    assert err.value.rank == 0
    assert "torch_xla runs 2 replica(s) here but notebook_launch planned 3" in str(err.value)
    assert "num_processes=2" in str(err.value)


def test_timeout_stops_every_replica(tmp_path):
    marker = tmp_path / "rank0-started"
    with pytest.raises(LaunchError) as err:
        launch(run_until_stopped, str(marker), tmp_path=tmp_path, timeout=120)
    assert err.value.kind == "timeout"
    if marker.exists():   # the replicas had started before the timeout (the usual case)
        assert_replicas_gone(marker)


GUARD_SCRIPT = textwrap.dedent("""
    import torch, torch_xla
    from notebook_launch import GuardError, notebook_launcher
    x = torch.ones(2, device=torch_xla.device())   # starts the runtime in the notebook
    try:
        notebook_launcher(lambda: 0, ui="none")
    except GuardError as exc:
        print("GUARD:", exc)
    else:
        print("LAUNCHED")
""")


def test_runtime_started_in_the_notebook_is_refused(tmp_path):
    # its own interpreter: starting the runtime here would spoil every later test
    out = subprocess.run([sys.executable, "-c", GUARD_SCRIPT], capture_output=True, text=True,
                         timeout=300, cwd=tmp_path, env={**os.environ, "PJRT_DEVICE": "CPU"})
    assert out.returncode == 0, out.stderr
    assert "GUARD: The XLA runtime is already initialized in this notebook" in out.stdout
    assert "restart the kernel" in out.stdout and "LAUNCHED" not in out.stdout
    assert issubclass(GuardError, Exception)  # the class the script catches


def kill_own_process():
    import signal
    import torch_xla.runtime as xr
    if xr.global_ordinal() == 1:
        os.kill(os.getpid(), signal.SIGKILL)   # as the OOM killer or a fatal XLA error would
    time.sleep(240)


def test_a_replica_process_that_dies_is_reported(tmp_path):
    with pytest.raises(LaunchError) as err:
        launch(kill_own_process, tmp_path=tmp_path)
    message = str(err.value)
    assert err.value.exc_type == "BrokenProcessPool"
    assert "a replica process died without a Python exception" in message


class RecordingDisplay(Display):
    """A display (the interface the supervisor drives) that keeps the final run state."""

    name = "recording"

    def __init__(self):
        super().__init__()
        self.final = None

    def close(self, state):
        self.final = state


def report_progress():
    import torch_xla.runtime as xr
    from notebook_launch.wire import protocol as channel
    ordinal = xr.global_ordinal()
    writer = channel.current()
    assert writer is not None   # a launched replica has its channel to the notebook
    writer.send(channel.PROGRESS, {"metrics": {"ordinal": ordinal},
                                   "bars": {"train": {"n": 5 + ordinal, "total": 10}}})
    return ordinal


def test_one_panel_row_per_ordinal_with_its_own_progress(tmp_path):
    display = RecordingDisplay()
    assert launch(report_progress, tmp_path=tmp_path, ui=display) == [0, 1]
    assert display.final is not None, "the supervisor closes its display"
    rows = display.final.ranks
    assert [r.rank for r in rows] == [0, 1]
    assert [r.device for r in rows] == ["CPU:0", "CPU:1"]
    assert [r.status for r in rows] == ["done", "done"]
    assert [r.metrics for r in rows] == [{"ordinal": 0}, {"ordinal": 1}]
    assert [r.bars["train"].n for r in rows] == [5, 6]
    assert rows[0].pid == rows[1].pid   # two threads of one process


def test_an_interrupt_stops_every_replica(tmp_path):
    import signal
    marker = tmp_path / "rank0-started"

    def interrupt_once_running():
        for _ in range(3000):
            if marker.exists():
                os.kill(os.getpid(), signal.SIGINT)   # what Jupyter's interrupt button sends
                return
            time.sleep(0.1)

    threading.Thread(target=interrupt_once_running, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        launch(run_until_stopped, str(marker), tmp_path=tmp_path)
    assert_replicas_gone(marker)


def run_until_stopped(marker):
    import torch_xla.runtime as xr
    if xr.global_ordinal() == 0:
        write_marker(marker)
    while True:
        time.sleep(0.1)


TWO_LAUNCHES_SCRIPT = textwrap.dedent("""
    import json, os
    from notebook_launch import notebook_launcher

    def seen():
        return {k: os.environ.get(k) for k in ("PJRT_DYNAMIC_PLUGINS", "XLA_FLAGS")}

    before = dict(os.environ)
    first = notebook_launcher(seen, ui="none")
    second = notebook_launcher(seen, ui="none")
    print("RESULT", json.dumps({"first": first, "second": second,
                                "notebook_env_unchanged": dict(os.environ) == before}))
""")


def test_importing_torch_xla_for_the_launch_leaves_the_notebook_environment_alone(tmp_path):
    # a fresh interpreter: here torch_xla is imported already, by this module
    env = {**os.environ, "PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "1",
           "NOTEBOOK_LAUNCH_LOG_DIR": str(tmp_path / "runs")}
    env.pop("XLA_FLAGS", None)
    env.pop("PJRT_DYNAMIC_PLUGINS", None)
    out = subprocess.run([sys.executable, "-c", TWO_LAUNCHES_SCRIPT], capture_output=True, text=True,
                         timeout=300, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    import json
    report = json.loads(out.stdout.split("RESULT ", 1)[1])
    assert report["notebook_env_unchanged"]
    # what torch_xla's import sets reaches the replicas of every launch, not just the first
    assert report["first"] == report["second"]
    assert report["first"][0]["PJRT_DYNAMIC_PLUGINS"] == "1"


def parallel_op_in_the_replica():
    t = torch.ones(20_000_000) * 3.0   # an OpenMP parallel region on the replica's thread
    return {"value": float(t[0]), "threads": torch.get_num_threads()}


def test_one_device_launch_after_a_parallel_op_in_the_notebook(tmp_path, monkeypatch):
    """GNU OpenMP deadlocks in a child forked from a thread that ran a parallel region, and
    with one device torch_xla runs the function on the launcher's main thread: the launcher
    is forked from the clean fork thread, so this returns instead of hanging to the timeout."""
    if torch.get_num_threads() < 2:
        pytest.skip("one OpenMP thread: no parallel region, nothing to deadlock")
    monkeypatch.setenv("CPU_NUM_DEVICES", "1")
    x = torch.ones(20_000_000)
    x.mul_(2.0)   # the notebook's main thread runs a parallel region
    [result] = launch(parallel_op_in_the_replica, tmp_path=tmp_path, timeout=120)
    assert result["value"] == 3.0 and result["threads"] >= 2


@dataclasses.dataclass
class XlaCheckpoint:
    step: int
    weights: torch.Tensor
    nested: dict


def module_and_dataclass_on_xla():
    device = torch_xla.device()
    model = torch.nn.Linear(3, 2).to(device)
    model.bias.requires_grad_(False)
    state = XlaCheckpoint(1, torch.ones(2, device=device), {"m": [torch.zeros(1, device=device)]})
    return {"model": model, "state": state, "state_dict": model.state_dict()}


def test_modules_and_dataclasses_with_xla_tensors_come_back_on_the_cpu(tmp_path, monkeypatch):
    """torch pickles an XLA tensor as a rebuild onto xla:0: unpickled in the notebook it would
    start the XLA runtime there (and the next launch would be refused)."""
    from notebook_launch.detect.xla import runtime_initialized
    monkeypatch.setenv("CPU_NUM_DEVICES", "1")
    [result] = launch(module_and_dataclass_on_xla, tmp_path=tmp_path)
    model, state = result["model"], result["state"]
    assert type(model.weight) is torch.nn.Parameter and model.weight.device.type == "cpu"
    assert model.weight.requires_grad and not model.bias.requires_grad
    assert model(torch.ones(1, 3)).shape == (1, 2)
    assert isinstance(state, XlaCheckpoint) and state.weights.device.type == "cpu"
    assert state.weights.tolist() == [1.0, 1.0] and state.nested["m"][0].device.type == "cpu"
    assert all(t.device.type == "cpu" for t in result["state_dict"].values())
    assert not runtime_initialized(), "unpickling the results started the XLA runtime in the notebook"
    assert launch(module_and_dataclass_on_xla, tmp_path=tmp_path)[0]["state"].step == 1   # the next launch works


# --- where the replicas are when the run hangs (issue 20) -----------------------------------------
HANG_TIMEOUT = 45
# On PJRT CPU, XLA itself ends a process whose collective waited 15 s for a replica (a fatal
# "Termination timeout" of its rendezvous; a TPU waits on). So the replica that reduces enters the
# reduction only this many seconds before the run's timeout: the timeout finds it waiting there.
ENTER_BEFORE_TIMEOUT = 6


def skips_an_all_reduce(timeout_at):
    """Replica 1 skips the all_reduce (an evaluation only it runs); replica 0 waits in it."""
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr
    t = torch.tensor([float(xr.global_ordinal() + 1)], device=torch_xla.device())
    if xr.global_ordinal() == 1:
        time.sleep(600)
    time.sleep(max(0.0, timeout_at - ENTER_BEFORE_TIMEOUT - time.time()))
    total = xm.all_reduce(xm.REDUCE_SUM, t)
    torch_xla.sync()
    return total.cpu().item()


def test_a_timeout_says_where_each_replica_is(tmp_path):
    import inspect
    lines, first = inspect.getsourcelines(skips_an_all_reduce)
    reduce_line = first + next(i for i, line in enumerate(lines) if "xm.all_reduce(" in line)
    sleep_line = first + next(i for i, line in enumerate(lines) if "time.sleep(600)" in line)
    cpu_line = first + next(i for i, line in enumerate(lines) if "total.cpu()" in line)
    here = os.path.basename(__file__)
    with pytest.raises(LaunchError) as err:
        launch(skips_an_all_reduce, time.time() + HANG_TIMEOUT, tmp_path=tmp_path, timeout=HANG_TIMEOUT)
    assert err.value.kind == "timeout"
    text = str(err.value)
    assert text.splitlines()[0] == (
        f"notebook_launch: timed out after {HANG_TIMEOUT} s: rank 0 waits in all_reduce #1 ({here}:{reduce_line}); "
        f"rank 1 never reached it: it is in skips_an_all_reduce() at {here}:{sleep_line} (time.sleep(600))")
    rank0, rank1 = text[text.index("rank 0:"):text.index("rank 1:")], text[text.index("rank 1:"):]
    assert "tensors (1,) float32" in rank0
    # each replica shows its own thread (two threads of one process): rank 0 waits for its data
    assert f"skips_an_all_reduce() at {here}:{cpu_line}" in rank0 and f"{here}:{sleep_line}" not in rank0
    assert f"skips_an_all_reduce() at {here}:{sleep_line}" in rank1 and f"{here}:{cpu_line}" not in rank1


def test_who_waits_in_a_lazy_xm_collective():
    """xm's collectives only add to the graph: a replica waits in its latest one when another
    replica has not issued that number, or issued another op as that number; when every replica
    issued the same, none is said to wait in it (they may be anywhere since)."""
    from notebook_launch.engines.xla.replica_whereabouts import who_waits
    from notebook_launch.diagnose.hang_verdict import Collective, RankWhereabouts

    def replica(rank, op=None, seq=0):
        return RankWhereabouts(rank, last=Collective(op, "default group", seq, "", None) if op else None)

    behind = [replica(0, "all_reduce", 4), replica(1, "all_reduce", 3), replica(2, "all_reduce", 4)]
    who_waits(behind)
    assert [r.inside.seq if r.inside else None for r in behind] == [4, None, 4]
    assert behind[1].last.seq == 3
    order = [replica(0, "all_reduce", 2), replica(1, "all_gather", 2)]
    who_waits(order)
    assert [r.inside.op for r in order] == ["all_reduce", "all_gather"]
    level = [replica(0, "all_reduce", 5), replica(1, "all_reduce", 5)]
    who_waits(level)
    assert all(r.inside is None and r.last.seq == 5 for r in level)
    never = [replica(0, "all_reduce", 1), replica(1)]
    who_waits(never)
    assert never[0].inside is not None and never[1].inside is None
