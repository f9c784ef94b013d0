"""The plan is pure: ranks, environment and ports without starting anything."""
from typing import Any, get_args

from notebook_launch.planning.net import free_port, port_is_free
from notebook_launch.planning.options import DEFAULT_USE_PORT
from notebook_launch.wire.plan import build_plan, cluster_plan, nccl_workarounds, omp_threads


def plan(**kw):
    args: dict[str, Any] = dict(num_processes=2, num_nodes=1, node_rank=0, master_addr="127.0.0.1",
                                master_port=29500, device_kind="cpu", mixed_precision="no", start_method="fork",
                                run_id="r1", user_env={}, cpu_count=8)
    args.update(kw)
    return build_plan(**args)


def test_ranks_and_world():
    p = plan(num_processes=4)
    assert p.world_size == 4
    assert [r.global_rank for r in p.ranks] == [0, 1, 2, 3]
    assert [r.env["LOCAL_RANK"] for r in p.ranks] == ["0", "1", "2", "3"]
    assert {r.env["WORLD_SIZE"] for r in p.ranks} == {"4"}
    assert p.dist_backend == "gloo"


def test_global_ranks_on_second_node():
    p = plan(num_processes=2, num_nodes=2, node_rank=1, master_addr="10.0.0.1")
    assert [r.global_rank for r in p.ranks] == [2, 3]
    env = p.ranks[1].env
    assert env["RANK"] == "3" and env["LOCAL_RANK"] == "1" and env["WORLD_SIZE"] == "4"
    assert env["GROUP_RANK"] == env["NODE_RANK"] == "1"
    assert "GLOO_SOCKET_IFNAME" not in env  # only forced to loopback on a single host


def test_cpu_environment_for_accelerate():
    env = plan(mixed_precision="bf16").ranks[0].env
    assert env["ACCELERATE_USE_CPU"] == "true"
    assert env["ACCELERATE_MIXED_PRECISION"] == "bf16"
    assert env["MASTER_ADDR"] == "127.0.0.1" and env["MASTER_PORT"] == "29500"
    assert env["GLOO_SOCKET_IFNAME"] == "lo"
    assert env["LOCAL_WORLD_SIZE"] == "2"


def test_omp_threads_shared_unless_user_set():
    assert plan(num_processes=2, cpu_count=8).ranks[0].env["OMP_NUM_THREADS"] == "4"
    assert plan(num_processes=16, cpu_count=8).ranks[0].env["OMP_NUM_THREADS"] == "1"
    assert "OMP_NUM_THREADS" not in plan(user_env={"OMP_NUM_THREADS": "3"}).ranks[0].env
    assert omp_threads(3, 2) == 1


def test_cuda_devices_one_per_rank_and_nccl():
    p = plan(device_kind="cuda", num_processes=2)
    assert [r.device for r in p.ranks] == ["cuda:0", "cuda:1"]
    assert p.dist_backend == "nccl"
    assert "ACCELERATE_USE_CPU" not in p.ranks[0].env


def test_rtx40_old_driver_gets_nccl_switches():
    assert nccl_workarounds(["NVIDIA GeForce RTX 4090"], "535.104") == {
        "NCCL_P2P_DISABLE": "1", "NCCL_IB_DISABLE": "1"}
    assert nccl_workarounds(["NVIDIA GeForce RTX 4090"], "550.54") == {}
    assert nccl_workarounds(["NVIDIA A100-SXM4-80GB"], "470.1") == {}
    env = plan(device_kind="cuda", gpu_names=["NVIDIA GeForce RTX 4080"], driver_version="525.1").ranks[0].env
    assert env["NCCL_P2P_DISABLE"] == "1"
    env = plan(device_kind="cuda", gpu_names=["NVIDIA GeForce RTX 4080"], driver_version="525.1",
               user_env={"NCCL_P2P_DISABLE": "0"}).ranks[0].env
    assert "NCCL_P2P_DISABLE" not in env  # the user's own setting wins (inherited)


def test_default_port_is_a_distinguishable_str():
    assert DEFAULT_USE_PORT == "29500"
    assert type(DEFAULT_USE_PORT) is not str


def test_port_probe():
    import socket
    port = free_port()
    assert port_is_free(port)
    with socket.socket() as s:
        s.bind(("", port))
        s.listen()
        assert not port_is_free(port)


def _env(**overrides):
    from notebook_launch.wire.plan import rank_environment
    arguments: dict[str, Any] = dict(
        global_rank=3, local_rank=1, num_processes=2, num_nodes=2, node_rank=1, world_size=4,
        master_addr="10.0.0.5", master_port=29511, device_kind="cuda", mixed_precision="no",
        run_id="r", user_env={}, cpu_count=8)
    arguments.update(overrides)
    return rank_environment(**arguments)


def test_one_builder_for_elastic_attempts_and_cluster_ranks():
    """Elastic's attempts and Ray's ranks build their environment here too (issue 21 item 8)."""
    env = _env(restart_count=2, max_restarts=3, interface="eth1")
    assert (env["TORCHELASTIC_RESTART_COUNT"], env["TORCHELASTIC_MAX_RESTARTS"]) == ("2", "3")
    assert (env["GLOO_SOCKET_IFNAME"], env["NCCL_SOCKET_IFNAME"]) == ("eth1", "eth1")
    kept = _env(interface="eth1", user_env={"NCCL_SOCKET_IFNAME": "ib0"})
    assert kept["GLOO_SOCKET_IFNAME"] == "eth1" and "NCCL_SOCKET_IFNAME" not in kept   # the user's wins
    plain = _env()
    assert (plain["TORCHELASTIC_RESTART_COUNT"], plain["TORCHELASTIC_MAX_RESTARTS"]) == ("0", "0")
    assert "NCCL_SOCKET_IFNAME" not in plain and "GLOO_SOCKET_IFNAME" not in plain   # two nodes: no "lo"
    assert plain["TORCHELASTIC_RUN_ID"] == "r" and "TORCHELASTIC_USE_AGENT_STORE" not in plain
    attempt = _env(rdzv_id="job-7", use_agent_store=False)   # elastic's rendezvous id, the attempt's own store
    assert (attempt["TORCHELASTIC_RUN_ID"], attempt["NOTEBOOK_LAUNCH_RUN_ID"]) == ("job-7", "r")
    assert attempt["TORCHELASTIC_USE_AGENT_STORE"] == "False"


def test_one_dist_backend_choice():
    from notebook_launch.detect.platform import Environment
    from notebook_launch.planning.target import LaunchTarget
    from notebook_launch.wire.plan import DeviceKind, dist_backend_for
    # every kind DeviceKind allows has a backend and a rank device (one added to the type alone fails here)
    kinds = get_args(DeviceKind)
    assert [dist_backend_for(k) for k in ("cpu", "cuda", "xla")] == ["gloo", "nccl", "xla"]
    for kind in kinds:
        target = LaunchTarget(Environment("script", kind, 1), kind, 1, 1, "fork")
        assert target.dist_backend == dist_backend_for(kind)   # the preview says what the plan does
        plan = build_plan(num_processes=1, num_nodes=1, node_rank=0, master_addr="127.0.0.1", master_port=1,
                          device_kind=kind, mixed_precision="no", start_method="fork", run_id="r",
                          user_env={}, cpu_count=1)
        assert plan.dist_backend == dist_backend_for(kind)


def test_a_cluster_engines_plan_is_one_row_per_global_rank_with_no_environment():
    """Ray's and SLURM's notebook-side plan (one builder for both): the rows are the global ranks, the
    device and backend follow the device kind, and no variable is set here (each node makes its own)."""
    gpus = cluster_plan(4, "cuda", "bf16", "slurm")
    assert [(r.global_rank, r.local_rank, r.device, r.env) for r in gpus.ranks] == [
        (rank, rank, "cuda", {}) for rank in range(4)]
    assert (gpus.world_size, gpus.num_processes, gpus.dist_backend, gpus.start_method, gpus.mixed_precision) == (
        4, 4, "nccl", "slurm", "bf16")
    cpus = cluster_plan(2, "cpu", "no", "ray")
    assert {r.device for r in cpus.ranks} == {"cpu"} and cpus.dist_backend == "gloo" and cpus.start_method == "ray"
