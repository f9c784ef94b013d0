"""Real launches on CPU ranks (fork, gloo): results, per-rank environment, Accelerate."""
import os

import torch

from notebook_launch import notebook_launcher

ENV_KEYS = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK",
            "MASTER_ADDR", "MASTER_PORT", "ACCELERATE_MIXED_PRECISION", "ACCELERATE_USE_CPU",
            "OMP_NUM_THREADS", "GLOO_SOCKET_IFNAME"]


def report_env():
    return {k: os.environ.get(k) for k in ENV_KEYS} | {"pid": os.getpid(), "threads": torch.get_num_threads()}


def test_every_rank_result_in_rank_order(log_dir):
    results = notebook_launcher(lambda x, y=0: (int(os.environ["RANK"]), x, y), args=(7,),
                                kwargs={"y": 3}, num_processes=3, log_dir=log_dir)
    assert results == [(0, 7, 3), (1, 7, 3), (2, 7, 3)]


def test_single_rank_runs_in_a_child_process(log_dir):
    (pid,) = notebook_launcher(os.getpid, num_processes=1, log_dir=log_dir)
    assert pid != os.getpid()


def test_default_num_processes_on_cpu_is_one(log_dir):
    assert notebook_launcher(lambda: os.environ["WORLD_SIZE"], log_dir=log_dir) == ["1"]


def test_rank_environment(log_dir, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = dict(os.environ)
    envs = notebook_launcher(report_env, num_processes=2, mixed_precision="BF16", log_dir=log_dir)
    assert dict(os.environ) == before, "the parent's environment must not change"
    for rank, env in enumerate(envs):
        assert env["RANK"] == env["LOCAL_RANK"] == str(rank)
        assert env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == "2"
        assert env["GROUP_RANK"] == env["NODE_RANK"] == "0"
        assert env["MASTER_ADDR"] == "127.0.0.1"
        assert env["MASTER_PORT"].isdigit()
        assert env["ACCELERATE_MIXED_PRECISION"] == "bf16"
        assert env["ACCELERATE_USE_CPU"] == "true"
        assert env["GLOO_SOCKET_IFNAME"] == "lo"
        threads = max(1, len(os.sched_getaffinity(0)) // 2)
        assert env["OMP_NUM_THREADS"] == str(threads) and env["threads"] == threads
    assert envs[0]["pid"] != envs[1]["pid"]


def test_user_omp_setting_is_kept(log_dir, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    envs = notebook_launcher(report_env, num_processes=2, log_dir=log_dir)
    assert [e["OMP_NUM_THREADS"] for e in envs] == ["1", "1"]


def all_reduce_rank():
    import torch.distributed as dist
    dist.init_process_group()  # no arguments: env:// from the launcher
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    backend = dist.get_backend_config()  # "cpu:gloo" when init picked the backend itself
    dist.destroy_process_group()
    return t, backend


def test_init_process_group_without_arguments(log_dir):
    results = notebook_launcher(all_reduce_rank, num_processes=3, log_dir=log_dir)
    assert [r[0].item() for r in results] == [6.0, 6.0, 6.0]
    assert {r[1] for r in results} == {"cpu:gloo"}


def tensors():
    rank = int(os.environ["RANK"])
    return {"w": torch.full((2,), float(rank), requires_grad=True) * 2, "list": [torch.ones(1)]}


def test_tensor_results_are_cpu_leaf_tensors_as_torch_save_keeps_them(log_dir):
    """As torch.save/torch.load: the value and requires_grad come back, the autograd history does
    not (a leaf with no grad_fn: nothing ties it to the rank's graph)."""
    results = notebook_launcher(tensors, num_processes=2, log_dir=log_dir)
    w = results[1]["w"]
    assert torch.equal(w.detach(), torch.tensor([2.0, 2.0]))
    assert w.device.type == "cpu" and w.requires_grad and w.is_leaf and w.grad_fn is None
    assert not results[1]["list"][0].requires_grad
    assert torch.equal(results[0]["list"][0], torch.ones(1))


def accelerate_rank():
    from accelerate import Accelerator
    accelerator = Accelerator()
    value = torch.tensor([accelerator.process_index], dtype=torch.float32)
    gathered = accelerator.gather(value)
    return (str(accelerator.distributed_type), accelerator.num_processes,
            accelerator.process_index, gathered.tolist(), accelerator.mixed_precision)


def test_accelerator_inside_ranks_is_multi_cpu(log_dir):
    results = notebook_launcher(accelerate_rank, num_processes=2, log_dir=log_dir)
    for rank, (kind, world, index, gathered, mp) in enumerate(results):
        assert kind.endswith("MULTI_CPU")
        assert world == 2 and index == rank
        assert gathered == [0.0, 1.0]
        assert mp == "no"


def test_accelerate_state_in_children_starts_empty_even_if_imported(log_dir):
    import accelerate.state  # imported (not instantiated) in the parent, as in most notebooks
    results = notebook_launcher(accelerate_rank, num_processes=2, log_dir=log_dir)
    assert [r[2] for r in results] == [0, 1]
    assert accelerate.state.PartialState._shared_state == {}


def test_launch_summary_line(log_dir, capsys):
    notebook_launcher(int, num_processes=2, log_dir=log_dir)
    out = capsys.readouterr().out
    assert "notebook_launch: 2 ranks on script (CPU, gloo, fork)" in out
    assert f"logs: {log_dir}" in out


# DDP imports torch._dynamo lazily; forked ranks inherit it from the parent instead of importing
# it each, when the launched code trains: tests/test_warm_imports.py (a fresh process per check).
