"""max_restarts on one node: the same torch-elastic path as multi-node runs."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from notebook_launch import LaunchArgumentError, LaunchError, notebook_launcher
from notebook_launch.display import Display
from notebook_launch.planning.net import free_port
from helpers.processes import children

pytestmark = pytest.mark.timeout(180)


def fail_on_first_attempt():
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    print(f"attempt {attempt} on rank {dist.get_rank()}", flush=True)
    if attempt == 0 and dist.get_rank() == 1:
        raise ValueError("first attempt fails")
    total = torch.ones(1)
    dist.all_reduce(total)
    dist.destroy_process_group()
    return {"attempt": attempt, "total": total.item(), "rank": int(os.environ["RANK"])}


def always_fail_on_rank_1():
    if os.environ["RANK"] == "1":
        raise ValueError(f"fails on attempt {os.environ['TORCHELASTIC_RESTART_COUNT']}")
    time.sleep(60)


def sleep_long():
    time.sleep(60)


class RecordingDisplay(Display):
    """A real display that remembers which attempts it was asked to draw."""

    def __init__(self):
        super().__init__()
        self.attempts = set()

    def refresh(self, state):
        assert state.max_restarts == 1
        self.attempts.add(state.attempt)

    def close(self, state):
        self.attempts.add(state.attempt)


@pytest.fixture
def recording_display():
    return RecordingDisplay()


def test_restart_recovers_and_the_panel_shows_the_attempt(tmp_path, capsys, recording_display):
    results = notebook_launcher(fail_on_first_attempt, num_processes=2, max_restarts=1, log_dir=tmp_path,
                                ui=recording_display)
    assert results == [{"attempt": 1, "total": 2.0, "rank": 0}, {"attempt": 1, "total": 2.0, "rank": 1}]
    assert recording_display.attempts == {0, 1}
    printed = capsys.readouterr().out
    assert "rank 1 failed (ValueError: first attempt fails); restarting every rank (restart 1 of 1)" in printed
    log = (tmp_path / "rank1.log").read_text()
    assert log.index("attempt 0 on rank 1") < log.index("restart 1 of 1") < log.index("attempt 1 on rank 1")


def test_used_up_restarts_raise_one_launch_error(tmp_path, capsys):
    with pytest.raises(LaunchError) as info:
        notebook_launcher(always_fail_on_rank_1, num_processes=2, max_restarts=2, log_dir=tmp_path, ui="none")
    error = info.value
    assert (error.rank, error.kind, error.exc_type) == (1, "exception", "ValueError")
    assert str(error).splitlines()[0] == "rank 1 failed: ValueError: fails on attempt 2"
    assert "Attempt 3 of 3: no restarts left (max_restarts=2)." in str(error)
    assert capsys.readouterr().out.count("restarting every rank") == 2


def test_timeout_ends_the_run_without_restarting(tmp_path, capsys):
    started = time.monotonic()
    with pytest.raises(LaunchError) as info:
        notebook_launcher(sleep_long, num_processes=2, max_restarts=3, timeout=2, log_dir=tmp_path, ui="none")
    assert info.value.kind == "timeout"
    assert "timed out after 2 s" in str(info.value)
    assert "restarting" not in capsys.readouterr().out
    assert time.monotonic() - started < 50


def test_signal_handlers_restored_and_no_processes_left(tmp_path):
    def mine(signum, frame):
        pass

    names = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT")
    previous = {n: signal.signal(getattr(signal, n), mine) for n in names}
    try:
        notebook_launcher(fail_on_first_attempt, num_processes=2, max_restarts=1, log_dir=tmp_path, ui="none")
        assert all(signal.getsignal(getattr(signal, n)) is mine for n in names)
    finally:
        for n, handler in previous.items():
            signal.signal(getattr(signal, n), handler)
    assert children() == []


@pytest.mark.parametrize("when", ["ranks running", "waiting for a node"])
def test_interrupt_stops_the_run(tmp_path, when):
    """SIGINT (a Jupyter interrupt) ends the call with KeyboardInterrupt, also
    while the rendezvous waits for a node that is not coming (static waits
    inside C++ otherwise, deaf to Ctrl-C for the whole rdzv_timeout)."""
    options = ("num_processes=2, max_restarts=1" if when == "ranks running"
               else f"num_processes=1, num_nodes=2, node_rank=0, rdzv_timeout=600, use_port='{free_port()}'")
    script = tmp_path / "interrupted.py"
    script.write_text(textwrap.dedent(f"""
        import time, psutil
        from notebook_launch import notebook_launcher
        def work():
            print("rank started", flush=True)
            time.sleep(60)
        try:
            notebook_launcher(work, {options}, log_dir={str(tmp_path)!r}, ui="text")
        except KeyboardInterrupt as exc:
            print("INTERRUPTED:", exc, "children:", psutil.Process().children(recursive=True), flush=True)
    """))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    wait_for = "rank started" if when == "ranks running" else "rendezvous: static"
    seen = []
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            seen.append(line)
            if wait_for in line:
                break
        time.sleep(1.0)
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    output = "".join(seen) + out
    assert "INTERRUPTED: notebook_launch: the run was interrupted" in output, output
    assert "children: []" in output, output
    assert time.monotonic() - started < 30, output


def test_bad_rendezvous_arguments_name_the_argument():
    with pytest.raises(LaunchArgumentError, match="rdzv_conf must be a dict"):
        notebook_launcher(sleep_long, num_processes=1, max_restarts=1, rdzv_conf="join_timeout=5")  # type: ignore[arg-type]  # on purpose: a str, not a dict
    with pytest.raises(LaunchArgumentError, match="rdzv_timeout must be a number of seconds > 0"):
        notebook_launcher(sleep_long, num_processes=1, max_restarts=1, rdzv_timeout=0)


# --- the restart rule elastic's agent and the Ray launcher share (restarts.py) -----------------

@pytest.mark.parametrize("kind,again", [("exception", True), ("signal", True), ("exit", True),
                                        ("timeout", False), ("stopped", False), ("interrupted", False),
                                        ("result", False), ("rendezvous", False), (None, False)])
def test_the_restart_rule(kind, again):
    from notebook_launch.scaffold import restarts
    assert restarts.restartable(kind) is again


def test_run_attempts_restarts_what_the_rule_allows_and_says_which_attempt_failed():
    from notebook_launch.scaffold import restarts
    tried, notices = [], []

    def attempt(number):
        tried.append(number)
        raise LaunchError(f"attempt {number} failed", kind="exception" if number < 2 else "timeout")

    with pytest.raises(LaunchError) as info:
        restarts.run_attempts(attempt, 5, lambda error, n: notices.append(n),
                              last_error=lambda error, n: LaunchError(f"{error} (attempt {n})", kind=error.kind))
    assert tried == [0, 1, 2] and notices == [1, 2]   # the timeout of attempt 2 is not restarted
    assert str(info.value) == "attempt 2 failed (attempt 2)"
    assert restarts.run_attempts(lambda n: n, 0, print, last_error=lambda e, n: e) == 0


def test_run_attempts_asks_the_launcher_only_of_a_failure_the_rule_restarts():
    """``may_restart`` (a SLURM job the scheduler ended) refuses a restart the rule allows; it is not
    asked of a failure the rule never restarts, nor once no restart is left."""
    from notebook_launch.scaffold import restarts
    asked, tried = [], []

    def attempt(number):
        tried.append(number)
        raise LaunchError(f"attempt {number} failed", kind="signal")

    def may_restart(error):
        asked.append(str(error))
        return len(asked) < 2

    with pytest.raises(LaunchError) as info:
        restarts.run_attempts(attempt, 5, lambda error, n: None, last_error=lambda error, n: error,
                              may_restart=may_restart)
    assert tried == [0, 1] and asked == ["attempt 0 failed", "attempt 1 failed"]
    assert str(info.value) == "attempt 1 failed"
    asked.clear()
    with pytest.raises(LaunchError):
        restarts.run_attempts(attempt, 0, lambda error, n: None, last_error=lambda error, n: error,
                              may_restart=may_restart)
    assert asked == []



# --- an attempt's environment: plan.rank_environment for the place elastic assigned ----------------

def _elastic_group(node, num_nodes, per_node, master_addr):
    """What elastic's rendezvous hands the agent's hooks (a WorkerGroup with one role)."""
    from types import SimpleNamespace
    world = num_nodes * per_node
    workers = [SimpleNamespace(global_rank=node * per_node + i, local_rank=i, world_size=world,
                               role_rank=node * per_node + i, role_world_size=world) for i in range(per_node)]
    return SimpleNamespace(group_rank=node, group_world_size=num_nodes, master_addr=master_addr, workers=workers)


def _without_socket_and_thread_settings(monkeypatch):
    for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "OMP_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)


def test_an_elastic_attempts_environment_is_rank_environments(monkeypatch):
    """plan.rank_environment writes every rank's variables, an elastic attempt's too (issue 21 item 8)."""
    from notebook_launch.engines.elastic import agent
    from notebook_launch.wire.plan import available_cpus, build_plan, rank_environment
    _without_socket_and_thread_settings(monkeypatch)
    monkeypatch.setattr(agent, "interface_toward", lambda address: "eth7")
    base = build_plan(num_processes=2, num_nodes=2, node_rank=0, master_addr="10.0.0.5", master_port=29500,
                      device_kind="cpu", mixed_precision="bf16", start_method="fork", run_id="run-1")
    # elastic's c10d rendezvous may give this node another place and rank 0 another address
    plan = agent.attempt_plan(base, _elastic_group(1, 2, 2, "10.0.0.9"), 40001, attempt=2, max_restarts=3,
                              run_id="run-1", rdzv_id="job-7")
    assert (plan.node_rank, plan.num_nodes, plan.world_size, plan.master_addr, plan.master_port) == \
        (1, 2, 4, "10.0.0.9", 40001)
    assert [spec.global_rank for spec in plan.ranks] == [2, 3]
    for local_rank, spec in enumerate(plan.ranks):
        assert spec.env == rank_environment(
            global_rank=2 + local_rank, local_rank=local_rank, num_processes=2, num_nodes=2, node_rank=1,
            world_size=4, master_addr="10.0.0.9", master_port=40001, device_kind="cpu", mixed_precision="bf16",
            run_id="run-1", user_env=os.environ, cpu_count=available_cpus(), restart_count=2, max_restarts=3,
            interface="eth7", rdzv_id="job-7", use_agent_store=False)
    env = plan.ranks[1].env
    assert (env["RANK"], env["LOCAL_RANK"], env["NODE_RANK"], env["GROUP_RANK"], env["ROLE_RANK"]) == \
        ("3", "1", "1", "1", "3")
    assert (env["GLOO_SOCKET_IFNAME"], env["NCCL_SOCKET_IFNAME"]) == ("eth7", "eth7")
    assert (env["TORCHELASTIC_RUN_ID"], env["NOTEBOOK_LAUNCH_RUN_ID"]) == ("job-7", "run-1")
    assert (env["TORCHELASTIC_RESTART_COUNT"], env["TORCHELASTIC_MAX_RESTARTS"]) == ("2", "3")
    assert env["TORCHELASTIC_USE_AGENT_STORE"] == "False"   # the attempt's own store, hosted by rank 0


def test_an_elastic_attempt_keeps_what_the_launch_settled_for_its_node(monkeypatch):
    """One node launched on loopback, where c10d names rank 0 by host name: gloo stays on "lo", the
    NCCL switches for this node's GPUs stay, and the user's own variables are inherited as they are."""
    from notebook_launch.engines.elastic import agent
    from notebook_launch.wire.plan import build_plan
    _without_socket_and_thread_settings(monkeypatch)
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "ib0")
    monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3")
    monkeypatch.setattr(agent, "interface_toward", lambda address: pytest.fail("one node needs no route"))
    base = build_plan(num_processes=2, num_nodes=1, node_rank=0, master_addr="127.0.0.1", master_port=29500,
                      device_kind="cuda", mixed_precision="no", start_method="spawn", run_id="run-1",
                      gpu_names=("NVIDIA GeForce RTX 4090",), driver_version="535.1")
    plan = agent.attempt_plan(base, _elastic_group(0, 1, 2, "myhost.example"), 40001, attempt=1, max_restarts=1,
                              run_id="run-1", rdzv_id="none")
    spec = plan.ranks[1]
    assert spec.device == "cuda:1" and spec.local_rank == 1
    env = spec.env
    assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["RANK"], env["WORLD_SIZE"]) == \
        ("myhost.example", "40001", "1", "2")
    assert env["GLOO_SOCKET_IFNAME"] == "lo" and "NCCL_SOCKET_IFNAME" not in env
    assert (env["NCCL_P2P_DISABLE"], env["NCCL_IB_DISABLE"]) == ("1", "1")
    assert "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in env and "OMP_NUM_THREADS" in env
    assert {**os.environ, **env}["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3"   # what the rank sees
