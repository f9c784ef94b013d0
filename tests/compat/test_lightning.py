"""Lightning Fabric inside launched ranks joins them instead of starting its own.

Two parents: a script (this pytest process) and a real Jupyter kernel, where
IPython sets ``sys.ps1`` and Lightning would otherwise pick ``ddp_fork`` and
fork processes of its own from every rank.
"""
from __future__ import annotations

import os
import textwrap

import pytest
import torch

from notebook_launch import LaunchError, notebook_launcher

pytest.importorskip("lightning")

N = 2


def _fabric_train(devices=N, steps=5):
    import torch.distributed as dist
    from lightning.fabric import Fabric

    fabric = Fabric(accelerator="cpu", devices=devices)
    fabric.launch()
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = fabric.setup(model, optimizer)
    gen = torch.Generator().manual_seed(100 + fabric.global_rank)   # each rank its own data
    for _ in range(steps):
        x = torch.randn(16, 3, generator=gen)
        loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
        optimizer.zero_grad()
        fabric.backward(loss)
        optimizer.step()
    total = fabric.all_reduce(torch.tensor(float(fabric.global_rank + 1)), reduce_op="sum")
    fabric.barrier()
    return {
        "global_rank": fabric.global_rank, "local_rank": fabric.local_rank,
        "world_size": fabric.world_size, "pid": os.getpid(),
        "dist_world": dist.get_world_size(),
        "environment": type(fabric.strategy.cluster_environment).__name__,
        "strategy": type(fabric.strategy).__name__,
        "launcher": type(fabric.strategy.launcher).__name__,
        "all_reduce": total.item(),
        "weight": model.module.weight.detach().clone(),
    }


def _check(results):
    assert [r["global_rank"] for r in results] == list(range(N))
    assert len({r["pid"] for r in results}) == N
    for r in results:
        assert r["world_size"] == N and r["dist_world"] == N
        assert r["environment"] == "TorchElasticEnvironment", r
        assert r["strategy"] == "DDPStrategy"
        assert r["launcher"] != "_MultiProcessingLauncher", "Fabric would fork its own processes"
        assert r["all_reduce"] == N * (N + 1) / 2
    assert torch.equal(results[0]["weight"], results[1]["weight"])


def test_fabric_joins_the_launched_ranks_from_a_script():
    results = notebook_launcher(_fabric_train, num_processes=N, ui="text", timeout=240)
    _check(results)
    pids = {r["pid"] for r in results}
    assert os.getpid() not in pids


def test_fabric_with_more_devices_than_ranks_fails_clearly():
    with pytest.raises(LaunchError) as info:
        notebook_launcher(_fabric_train, args=(4,), num_processes=N, ui="text", timeout=120)
    assert "does not match the world size (2)" in str(info.value)


def test_fabric_joins_the_launched_ranks_from_a_jupyter_kernel():
    from nbutil import cell_text, make_notebook, run_notebook
    import inspect
    body = textwrap.dedent(inspect.getsource(_fabric_train))
    nb = make_notebook(
        "import os, sys, torch\nfrom lightning.fabric import Fabric\n"
        "from lightning.fabric.utilities.imports import _IS_INTERACTIVE\nprint('interactive', _IS_INTERACTIVE)",
        f"N = {N}\n" + body,
        "from notebook_launch import notebook_launcher\n"
        "results = notebook_launcher(_fabric_train, num_processes=N, ui='text')\n"
        "summary = [(r['environment'], r['launcher'], r['world_size'], r['all_reduce'], r['pid'] != os.getpid())"
        " for r in results]\n"
        "same = torch.equal(results[0]['weight'], results[1]['weight'])\n"
        "print('SUMMARY', summary, same)",
    )
    nb = run_notebook(nb, cwd=os.getcwd(), timeout=300)
    assert "interactive True" in cell_text(nb.cells[0]), "the kernel is not interactive: test proves nothing"
    out = cell_text(nb.cells[2])
    row = ("TorchElasticEnvironment", "_SubprocessScriptLauncher", N, float(N * (N + 1) / 2), True)
    assert f"SUMMARY {[row] * N} True" in out, out
