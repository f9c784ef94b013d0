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
    from lightning.fabric.strategies import ParallelStrategy

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
    assert isinstance(total, torch.Tensor)   # one tensor reduced, one tensor back
    assert isinstance(fabric.strategy, ParallelStrategy)   # DDP here: it has a cluster environment
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
    from helpers.nbutil import cell_text, make_notebook, run_notebook
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


# --- Lightning's progress bars in the panel (issue 25 items 1, 2) -------------------------
LIGHTNING_FIT = '''
from notebook_launch import notebook_launcher

def fit(bar="rich"):
    import torch
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar
    from torch.utils.data import DataLoader, TensorDataset

    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, _):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.layer(x), y)
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch, _):
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self.layer(x), y))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    callbacks = [TQDMProgressBar(refresh_rate=1)] if bar == "tqdm" else []
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, callbacks=callbacks,
                         logger=False, enable_checkpointing=False, enable_model_summary=False)
    trainer.fit(Tiny(), DataLoader(data, batch_size=8), DataLoader(data, batch_size=16))
    chosen = type(trainer.progress_bar_callback).__name__
    import rich
    return chosen, rich.get_console().is_jupyter
'''


@pytest.fixture(scope="module")
def lightning_notebook():
    from helpers.nbutil import make_notebook, run_notebook
    from helpers.panel_helpers import KEEP_STATES_CELL
    cells = [KEEP_STATES_CELL, LIGHTNING_FIT,
             "print('RESULT', notebook_launcher(fit, args=('rich',), num_processes=2, ui=keeping()))\n"
             "print('BARS', (bars_of(0), bars_of(1)))",
             "print('RESULT', notebook_launcher(fit, args=('tqdm',), num_processes=2, ui=keeping()))\n"
             "print('BARS', (bars_of(0), bars_of(1)))"]
    return run_notebook(make_notebook(*cells), cwd=os.getcwd(), timeout=400, allow_errors=True)


def _printed(cell, marker):
    import ast
    from helpers.nbutil import cell_text
    text = cell_text(cell)
    for line in text.splitlines():
        if line.startswith(marker + " "):
            return ast.literal_eval(line[len(marker) + 1:])
    raise AssertionError(f"{marker} not printed: {text}")


def _check_lightning_bars(rank0, rank1):
    """Lightning draws bars on rank 0 only (it disables them on the others).
    Train bars (reset each epoch, one bar) and a validation bar per epoch; the row ends on
    the training bar, not on the sanity check that came first or the validation that came last."""
    assert rank1 == ([], None)
    bars, main = rank0
    train = [b for b in bars if b[0].startswith("Epoch")]
    assert len(train) == 1 and train[0][1:] == (4, 4, True), bars       # 64 / 8 / 2 ranks
    sanity = [b for b in bars if b[0].startswith("Sanity Checking")]   # tqdm adds " DataLoader 0"
    validation = [b for b in bars if b[0].startswith("Validation")]
    assert len(sanity) == 1 and len(validation) == 2, bars
    assert all(b[1:] == (2, 2, True) for b in sanity + validation), bars
    assert main.startswith("Epoch 1"), main


def test_lightning_default_rich_bar_reaches_the_panel_from_a_kernel(lightning_notebook):
    from helpers.nbutil import cell_text
    cell = lightning_notebook.cells[2]
    assert _printed(cell, "RESULT") == [("RichProgressBar", False)] * N
    _check_lightning_bars(*_printed(cell, "BARS"))
    assert "\x1b[" not in cell_text(cell)          # the cell gets plain text, no cursor or colour codes


def test_lightning_tqdm_bar_row_follows_the_training_bar(lightning_notebook):
    from helpers.nbutil import cell_text
    cell = lightning_notebook.cells[3]
    assert _printed(cell, "RESULT") == [("TQDMProgressBar", False)] * N
    _check_lightning_bars(*_printed(cell, "BARS"))
    assert "\x1b[" not in cell_text(cell)          # the cell gets plain text, no cursor or colour codes
