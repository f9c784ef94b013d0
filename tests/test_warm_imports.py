"""The parent imports torch._dynamo before forking only for launches that look like training:
a first launch of a quick function in a fresh kernel does not pay 1-2 s for it, and a
training launch's ranks still share it instead of each importing it."""
from __future__ import annotations

import functools
import os
import subprocess
import sys
import textwrap

import torch

from notebook_launch.engines.local.warm_imports import looks_like_training

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def trivial():
    return int(os.environ.get("RANK", "0"))


def uses_ddp():
    from torch.nn.parallel import DistributedDataParallel as DDP
    return DDP


def one_step(model, optimizer):
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()


def calls_a_helper_that_trains():
    model = torch.nn.Linear(2, 2)
    one_step(model, None)


class Job:
    def __init__(self, lr):
        self.lr = lr

    def __call__(self):
        optimizer = torch.optim.SGD([torch.zeros(1)], lr=self.lr)
        optimizer.zero_grad()


def test_training_code_is_recognized_through_helpers_partials_methods_and_objects():
    assert looks_like_training(uses_ddp)
    assert looks_like_training(calls_a_helper_that_trains)
    assert looks_like_training(functools.partial(calls_a_helper_that_trains))
    assert looks_like_training(Job(0.1))
    assert looks_like_training(Job(0.1).__call__)
    assert looks_like_training(lambda: torch.compile)


def test_code_that_does_not_train_is_not():
    assert not looks_like_training(trivial)
    assert not looks_like_training(lambda: 1 + 1)
    assert not looks_like_training(int)
    assert not looks_like_training(print)
    assert not looks_like_training(os.getcwd)   # library code is not followed


FRESH_KERNEL = textwrap.dedent("""
    import sys, torch
    from notebook_launch import notebook_launcher

    def trivial():
        return "torch._dynamo" in sys.modules

    def train():
        inherited = "torch._dynamo" in sys.modules   # before this rank's own DDP and optimizer
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        dist.init_process_group("gloo")
        model = DDP(torch.nn.Linear(2, 2))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.ones(1, 2)).sum().backward()
        optimizer.step()
        return inherited

    print(notebook_launcher(trivial, num_processes=2, ui="none"), "torch._dynamo" in sys.modules)
    print(notebook_launcher(train, num_processes=2, ui="none"), "torch._dynamo" in sys.modules)
    print(notebook_launcher(trivial, num_processes=2, ui="none"))
""")


def test_a_fresh_process_pays_for_torch_dynamo_only_when_it_launches_training(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               NOTEBOOK_LAUNCH_LOG_DIR=str(tmp_path / "runs"))
    done = subprocess.run([sys.executable, "-c", FRESH_KERNEL], capture_output=True, text=True, env=env,
                          timeout=240, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if not line.startswith("notebook_launch")]
    assert lines == ["[False, False] False",    # a quick function: nothing imported, here or in ranks
                     "[True, True] True",       # training: imported once here, ranks inherit it
                     "[True, True]"], done.stdout  # and it stays for every later launch


PREIMPORT_CHECK = """
import sys, threading
def state():
    return ('torch._dynamo' in sys.modules,
            [t.name for t in threading.enumerate() if t.name == 'notebook_launch-preimport'])
"""


def test_a_kernel_imports_torch_dynamo_between_cells_once_the_notebook_defines_training_code():
    """In a kernel the import happens after the cell that defines a training function; the next
    cell (here run at once) starts only when it is done, and a launch in it forks ranks that
    have it already. A notebook that defines only quick functions never pays for it."""
    from helpers.nbutil import make_notebook, run_notebook
    nb = run_notebook(make_notebook(
        PREIMPORT_CHECK + "import torch\nimport notebook_launch\nnotebook_launch.install_hooks()\n"
                          "before = state()\nfrom notebook_launch import notebook_launcher",
        "def quick():\n    return 1",
        "print(before, state())",
        "def train():\n    model = torch.nn.Linear(2, 1)\n    model(torch.ones(1, 2)).sum().backward()",
        "print(state())",
        "def rank_has_it():\n    import sys\n    return 'torch._dynamo' in sys.modules\n"
        "print(notebook_launcher(rank_has_it, num_processes=2, ui='none'))",
    ), timeout=300)
    text = ["".join(out.get("text", "") for out in cell.outputs) for cell in nb.cells]
    assert "(False, []) (False, [])" in text[2], text
    assert "(True, [])" in text[4], text
    assert "[True, True]" in text[5], text


def test_the_kernel_import_can_be_turned_off():
    from helpers.nbutil import make_notebook, run_notebook
    nb = run_notebook(make_notebook(
        PREIMPORT_CHECK + "import os\nos.environ['NOTEBOOK_LAUNCH_PREIMPORT'] = '0'\n"
                          "import torch\nimport notebook_launch\nnotebook_launch.install_hooks()\n"
                          "from notebook_launch import notebook_launcher",
        "def train(model):\n    model(torch.ones(1, 2)).sum().backward()",
        "import time\ntime.sleep(0.5)\nprint(state())",
    ), timeout=300)
    assert "(False, [])" in nb.cells[2].outputs[0]["text"]
