"""Lightning's process-starting DDP strategies inside a launch (issue 25 item 5): ``ddp_notebook``,
``ddp_fork``, ``ddp_spawn``, ``DDPStrategy(start_method=...)`` and Fabric's, kept in a notebook moved
to our launcher, join the launched ranks (rank/integrations/lightning_strategy.py) instead of starting two more
processes per rank that fail with "address already in use". Real Lightning, a real kernel."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("lightning")

TRAIN = textwrap.dedent('''
    import os
    import torch
    import lightning as L

    def train(strategy):
        class Tiny(L.LightningModule):
            def __init__(self):
                super().__init__()
                self.layer = torch.nn.Linear(3, 1)
            def training_step(self, batch, index):
                return self.layer(batch[0]).pow(2).mean()
            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)
        if strategy == "DDPStrategy(start_method='forkserver')":
            from lightning.pytorch.strategies import DDPStrategy
            strategy = DDPStrategy(start_method="forkserver")
        data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(16, 3)), batch_size=4)
        trainer = L.Trainer(strategy=strategy, accelerator="cpu", devices=2, max_epochs=1, logger=False,
                            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
        trainer.fit(Tiny(), data)
        weight = trainer.strategy.reduce(trainer.lightning_module.layer.weight.detach().sum(), reduce_op="sum")
        return (trainer.global_rank, trainer.world_size, type(trainer.strategy.launcher).__name__,
                os.getpid(), round(float(weight), 6))

    def fabric_train(strategy):
        from lightning.fabric import Fabric
        fabric = Fabric(accelerator="cpu", devices=2, strategy=strategy)
        fabric.launch()
        total = fabric.all_reduce(torch.tensor(float(fabric.global_rank + 1)), reduce_op="sum")
        return fabric.global_rank, fabric.world_size, type(fabric.strategy.launcher).__name__, float(total)
''')


def _check_trainer(results):
    (rank0, world0, launcher0, pid0, weight0), (rank1, world1, launcher1, pid1, weight1) = results
    assert (rank0, rank1, world0, world1) == (0, 1, 2, 2)
    assert launcher0 == launcher1 == "_SubprocessScriptLauncher"   # the launcher strategy="ddp" gets
    assert pid0 != pid1 and weight0 == weight1                      # two ranks, one trained model


@pytest.mark.parametrize("strategy", ["ddp_notebook", "ddp_spawn", "ddp_fork",
                                      "DDPStrategy(start_method='forkserver')"])
def test_process_starting_strategies_join_the_ranks_in_a_kernel(strategy):
    from helpers.nbutil import cell_text, make_notebook, run_notebook
    nb = run_notebook(make_notebook(
        TRAIN + "from notebook_launch import notebook_launcher",
        f"print(notebook_launcher(train, args=({strategy!r},), num_processes=2, ui='none', timeout=240))",
    ), timeout=400)
    text = cell_text(nb.cells[1])
    assert "address already in use" not in text
    _check_trainer(eval(text.strip().splitlines()[-1]))


def test_fabric_ddp_notebook_joins_the_ranks_in_a_kernel():
    from helpers.nbutil import cell_text, make_notebook, run_notebook
    nb = run_notebook(make_notebook(
        TRAIN + "from notebook_launch import notebook_launcher",
        "print(notebook_launcher(fabric_train, args=('ddp_notebook',), num_processes=2, ui='none', timeout=240))",
    ), timeout=400)
    results = eval(cell_text(nb.cells[1]).strip().splitlines()[-1])
    assert results == [(0, 2, "_SubprocessScriptLauncher", 3.0), (1, 2, "_SubprocessScriptLauncher", 3.0)]


def test_lightning_imported_only_in_the_rank_is_wrapped_too(tmp_path):
    """The notebook never imported Lightning: the rank imports it inside the function (import hook)."""
    script = tmp_path / "train.py"
    script.write_text("import sys\nfrom notebook_launch import notebook_launcher\n"
                      "def run():\n"
                      "    assert 'lightning' not in sys.modules\n"
                      "    exec(compile(TRAIN, 'train', 'exec'), globals())\n"
                      "    return train('ddp_notebook')\n"
                      f"TRAIN = {TRAIN!r}\n"
                      "if __name__ == '__main__':\n"
                      "    print(notebook_launcher(run, num_processes=2, ui='none', timeout=240))\n")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _check_trainer(eval(proc.stdout.strip().splitlines()[-1]))


def test_outside_a_launched_rank_lightning_keeps_its_own_launcher():
    """Without the ranks' environment (no TORCHELASTIC_RUN_ID), ddp_notebook still starts its processes."""
    code = ("from notebook_launch.rank.integrations import lightning_strategy\nlightning_strategy.install()\n"
            "import lightning as L\n"
            "trainer = L.Trainer(strategy='ddp_notebook', accelerator='cpu', devices=2, logger=False)\n"
            "print(type(trainer.strategy.launcher).__name__)\n")
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "_MultiProcessingLauncher"
