"""``import notebook_launch`` changes nothing (issue 21 item 6): torch, IPython, logging, at-fork
handlers and threads are as they were until hooks.install() runs (%load_ext, the first launch or
notebook_launch.install_hooks()). Checked in a fresh interpreter and in a real Jupyter kernel;
the same snapshot taken after %load_ext shows every hook, so the comparison can fail."""
from __future__ import annotations

import os
import subprocess
import sys

from helpers.nbutil import cell_text, make_notebook, run_notebook

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# This tree first on the path (not whatever notebook_launch the interpreter has installed)
FRESH_ENV = {"PYTHONPATH": ROOT, "PATH": "/usr/bin:/bin"}

# What the process looks like: compared before and after `import notebook_launch`. It imports
# nothing itself: a bare interpreter stays bare (tests/test_light_imports.py checks every module).
SNAPSHOT = '''
import logging, os, pkgutil, sys, threading

# os.register_at_fork cannot be read back: every registration from here on is seen as it is made
_at_fork_of_ours = []
_register_at_fork = os.register_at_fork

def _seen_register_at_fork(**hooks):
    _at_fork_of_ours.extend(f"{h.__module__}.{h.__qualname__}" for h in hooks.values()
                            if (getattr(h, "__module__", None) or "").startswith("notebook_launch"))
    return _register_at_fork(**hooks)

os.register_at_fork = _seen_register_at_fork

def import_every_module():
    """Every module of the package, not only what its __init__ imports (optional extras left out)."""
    import notebook_launch
    for info in pkgutil.walk_packages(notebook_launch.__path__, "notebook_launch."):
        try:
            __import__(info.name)
        except ImportError:   # torch_xla, ray parts where they are not installed
            pass

def process_snapshot(shell=None):
    nl_logger = logging.root.manager.loggerDict.get("notebook_launch")
    warm = sys.modules.get("notebook_launch.engines.local.warm_imports")
    torch = sys.modules.get("torch")
    state = {
        "torch imported": torch is not None,
        "IPython imported": "IPython" in sys.modules,
        "torch.cuda._lazy_init": getattr(getattr(torch, "cuda", None), "_lazy_init", None),
        "torch._C._cuda_getDeviceCount": getattr(getattr(torch, "_C", None), "_cuda_getDeviceCount", None),
        "root logger": (logging.root.level, list(logging.root.handlers)),
        "notebook_launch logger": (getattr(nl_logger, "level", 0), list(getattr(nl_logger, "handlers", []))),
        "loggers with handlers": sorted(name for name, lg in logging.root.manager.loggerDict.items()
                                        if getattr(lg, "handlers", None)),
        "threads": sorted(t.name for t in threading.enumerate()),
        "at-fork handlers of notebook_launch": list(_at_fork_of_ours),
        "warm imports hooked": bool(getattr(warm, "_hooked", False)),
    }
    if shell is not None:
        state["IPython events"] = {name: list(cbs) for name, cbs in shell.events.callbacks.items()}
        state["input transformers"] = (list(shell.input_transformers_cleanup),
                                       list(shell.input_transformers_post))
        state["ast transformers"] = list(shell.ast_transformers)
    return state

def changed(before, after):
    return sorted(k for k in before if before[k] != after.get(k))
'''


def test_import_in_a_fresh_interpreter_changes_nothing():
    script = SNAPSHOT + '''
before = process_snapshot()
import notebook_launch
print("changed by import:", changed(before, process_snapshot()))
import torch   # what the snapshot sees from here on includes torch's functions
before = process_snapshot()
import_every_module()
print("changed by importing every module:", changed(before, process_snapshot()))
notebook_launch.install_hooks()
print("changed by install_hooks:", changed(before, process_snapshot()))
'''
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={"NOTEBOOK_LAUNCH_DEBUG": "1", **FRESH_ENV})
    assert proc.returncode == 0, proc.stderr
    assert "changed by import: []" in proc.stdout
    assert "changed by importing every module: []" in proc.stdout, proc.stdout
    # the hooks themselves are seen by the same snapshot (a CPU build has no _cuda_getDeviceCount)
    assert "'notebook_launch logger'" in proc.stdout.split("changed by install_hooks:")[1]
    assert "'torch.cuda._lazy_init'" in proc.stdout.split("changed by install_hooks:")[1]


def test_import_in_a_kernel_changes_nothing_until_load_ext():
    nb = make_notebook(
        SNAPSHOT + "import torch\nshell = get_ipython()\nbefore = process_snapshot(shell)",
        "import notebook_launch\nprint('changed by import:', changed(before, process_snapshot(shell)))",
        "def train():\n    return torch.nn.Linear(2, 2)   # training code: what warm_imports looks for",
        "print('changed by a cell:', changed(before, process_snapshot(shell)))",
        "%load_ext notebook_launch",
        "print('changed by load_ext:', changed(before, process_snapshot(shell)))",
    )
    out = run_notebook(nb, timeout=300)
    assert cell_text(out.cells[1]).strip() == "changed by import: []"
    assert cell_text(out.cells[3]).strip() == "changed by a cell: []"
    after_load_ext = cell_text(out.cells[5])
    for hook in ("IPython events", "at-fork handlers of notebook_launch", "torch.cuda._lazy_init"):
        assert repr(hook) in after_load_ext, after_load_ext


def test_the_first_launch_installs_the_hooks():
    """No %load_ext, no install_hooks(): the first launch installs them, and says so in the guard's
    words ("at the first launch") when CUDA was touched before."""
    script = SNAPSHOT + '''
import torch
before = process_snapshot()
import notebook_launch
from notebook_launch import hooks, notebook_launcher
assert hooks.installed_by() is None
def one():
    return 1
if __name__ == "__main__":
    print(notebook_launcher(one, num_processes=1, ui="none"))
    print("installed by:", hooks.installed_by())
    print("changed by the launch:", changed(before, process_snapshot()))
'''
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == 0, proc.stderr
    assert "installed by: the first launch" in proc.stdout
    changed_by_launch = proc.stdout.split("changed by the launch:")[1]
    assert "'torch.cuda._lazy_init'" in changed_by_launch
    assert "'IPython imported'" not in changed_by_launch   # no shell runs here: nothing to hook, nothing to import
