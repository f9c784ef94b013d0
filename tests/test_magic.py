"""``%load_ext notebook_launch`` and ``%%launch`` in a real Jupyter kernel."""
from __future__ import annotations

import pytest

from notebook_launch.errors import LaunchArgumentError
from notebook_launch.magics.launch import parse_launch_line

from helpers.nbutil import cell_text, make_notebook, run_notebook


def test_options_become_launcher_arguments():
    opts = parse_launch_line("-n 4 --mixed-precision bf16 --timeout 30 --start-method fork "
                             "--ui text --return model_state,losses --return acc --port 29600")
    assert opts == {"num_processes": 4, "mixed_precision": "bf16", "timeout": 30.0,
                    "start_method": "fork", "ui": "text", "log_dir": None, "display_ranks": None,
                    "return_names": ("model_state", "losses", "acc"), "use_port": "29600"}
    assert parse_launch_line("")["num_processes"] is None
    assert parse_launch_line("--display-ranks 0,2")["display_ranks"] == [0, 2]
    assert parse_launch_line("--display-ranks all")["display_ranks"] == "all"


@pytest.mark.parametrize("line, words", [
    ("-n four", "-n/--num-processes must be a whole number"),
    ("--bogus 1", "unrecognized arguments: --bogus 1"),
    ("--return 'a b'", "not names: 'a b'"),
    ("--timeout soon", "--timeout must be a number of seconds"),
    ("--display-ranks first", "--display-ranks takes 'all' or ranks separated by commas"),
    ("--stall-after soon", "--stall-after must be a number of seconds, or none"),
    ("--lines-per-second many", "--lines-per-second must be a whole number of lines a second, or all"),
])
def test_bad_options_name_the_option_and_show_usage(line, words):
    with pytest.raises(LaunchArgumentError) as info:
        parse_launch_line(line)
    assert words in str(info.value)
    assert "Usage: %%launch" in str(info.value)


def test_ranks_start_options_reach_start_ranks(monkeypatch):
    """%ranks start's --stall-after, --lines-per-second and --cluster become start_ranks' arguments
    (start_ranks itself is replaced by a recorder here: the Ray side has its own tests, on real
    clusters, in tests/raycluster)."""
    from notebook_launch.engines.ray.cluster import RayCluster
    from notebook_launch.magics import ranks as ranks_magic_module
    calls = []

    class StartRanksRecorder:
        closed = False

        def __init__(self, **kwargs):
            calls.append(kwargs)

        def close(self):
            self.closed = True

    monkeypatch.setattr(ranks_magic_module, "start_ranks", StartRanksRecorder)
    monkeypatch.setattr(ranks_magic_module, "_active", None)
    ranks_magic_module.ranks_magic(None, "start -n 2 --stall-after 60 --lines-per-second all --cluster 10.1.2.3:6379")
    kwargs = calls[-1]
    assert kwargs["stall_after"] == 60.0 and kwargs["lines_per_second"] == "all"
    assert isinstance(kwargs["cluster"], RayCluster) and kwargs["cluster"].address == "10.1.2.3:6379"
    assert "start_method" not in kwargs
    ranks_magic_module.ranks_magic(None, "stop")
    ranks_magic_module.ranks_magic(None, "start -n 2 --stall-after none")
    assert calls[-1]["stall_after"] is None and "cluster" not in calls[-1] and "lines_per_second" not in calls[-1]
    ranks_magic_module.ranks_magic(None, "stop")
    with pytest.raises(LaunchArgumentError, match="--spawn and --cluster do not go together"):
        ranks_magic_module.ranks_magic(None, "start -n 2 --spawn --cluster auto")
    with pytest.raises(LaunchArgumentError, match="start the ranks with %ranks start --stall-after none"):
        ranks_magic_module.ranks_magic(None, "--stall-after none", "x = 1")


LOAD_EXT_CHECK = """
from IPython.testing.globalipapp import start_ipython
shell = start_ipython()
from notebook_launch.notebook import cuda_tracking
cuda_tracking._installed = False        # as if notebook_launch had been imported before torch
hooks = len(shell.events.callbacks["post_run_cell"])
shell.run_line_magic("load_ext", "notebook_launch")
print("installed", cuda_tracking._installed)
print("new hooks", len(shell.events.callbacks["post_run_cell"]) - hooks)
print("magic", "launch" in shell.magics_manager.magics["cell"])
"""


def test_load_ext_installs_cuda_tracking_and_the_magic():
    # In a child interpreter: a global IPython shell would leak into the other tests.
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-c", LOAD_EXT_CHECK], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "installed True" in proc.stdout and "new hooks 1" in proc.stdout and "magic True" in proc.stdout, \
        proc.stdout + proc.stderr


SETUP = "%load_ext notebook_launch\nimport torch\nscale = 3\ndef helper(x):\n    return x * scale"

BODY_OK = """%%launch -n 2 --ui text --return total,gathered,rank_seen
import torch.distributed as dist
dist.init_process_group()
rank_seen = dist.get_rank()
t = torch.tensor([helper(rank_seen + 1.0)])   # notebook globals: helper, scale, torch
dist.all_reduce(t)
total = t.item()
parts = [torch.zeros(1) for _ in range(dist.get_world_size())]
dist.all_gather(parts, torch.tensor([float(rank_seen)]))
gathered = [p.item() for p in parts]
print(f"hello from rank {rank_seen}")
dist.destroy_process_group()
"""

BODY_FAILS = """%%launch -n 2 --ui text --timeout 120
import os
if os.environ["RANK"] == "1":
    raise ValueError("bad value on rank 1")
"""

# wait_for_everyone(): a rank that ends right after init_process_group can make a peer still in gloo's
# connectFullMesh fail ("Connection reset by peer"; plain torch 2.13 does so under load too), so the ranks
# meet once before they return, as training code does in its first collective
BODY_BF16 = """%%launch -n 2 --ui none --mixed-precision bf16 --return mp, nproc
from accelerate import Accelerator
acc = Accelerator()
mp, nproc = acc.mixed_precision, acc.num_processes
acc.wait_for_everyone()
"""

GUARD = """from accelerate import PartialState
PartialState(cpu=True)
"""


def test_launch_magic_in_a_kernel():
    nb = make_notebook(
        SETUP,
        "import notebook_launch.notebook.cuda_tracking as ct\nprint('tracking', ct._installed)",
        BODY_OK,
        "print('back', total, gathered, rank_seen)",
        BODY_FAILS,
        "%%launch -n 2 --bogus\npass",
        "%%launch -n 2\ndef broken(:\n    pass",
        BODY_BF16,
        "print('mp', mp, nproc)",
        GUARD,
        "%%launch -n 2 --ui none\npass",
        "from notebook_launch.cli import main as cli_main\ncli_main(['env'])",
    )
    nb = run_notebook(nb, allow_errors=True, timeout=300)
    out = [cell_text(c) for c in nb.cells]
    assert "tracking True" in out[1]
    assert "[rank 0] hello from rank 0" in out[2] and "[rank 1] hello from rank 1" in out[2], out[2]
    # rank 0's values come back; scale=3, ranks 1 and 2 -> 3 + 6
    assert "back 9.0 [0.0, 1.0] 0" in out[3], out[3]
    # a failing rank: the same LaunchError, naming the rank, with the cell's line
    assert "LaunchError: rank 1 failed: ValueError: bad value on rank 1" in out[4], out[4]
    assert 'raise ValueError("bad value on rank 1")' in out[4]
    assert "LaunchArgumentError" in out[5] and "--bogus" in out[5]
    assert "SyntaxError" in out[6] and "notebook_launch:" not in out[6]   # refused before any launch
    assert not [o for o in nb.cells[7].outputs if o.output_type == "error"], out[7]   # the bf16 launch itself
    assert "mp bf16 2" in out[8], out[8]
    assert "GuardError" in out[10] and "PartialState" in out[10]
    # `env` from inside a kernel sees the notebook and the widget panel it would use
    assert "where:" in out[11] and "display:        widget" in out[11], out[11]
