"""``import notebook_launch`` imports nothing heavy, and neither does a launch that does not need it
(issue 32 item 8): no torch, numpy, IPython, widgets, rich, Accelerate, Ray, Transformers,
Lightning, torch_xla or psutil, for the package, for every module a user imports, for
``%load_ext`` and for the first launch of a function that uses none of them, in the notebook
and in its ranks (forked and spawned). Every check starts from a bare interpreter (a fresh
``python -c`` that has imported nothing of these) and compares ``sys.modules``; each test
also shows that the same check sees a heavy import where one happens, so it can fail."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Imported by nothing of ours until a launch (or the user's code) needs it.
HEAVY = ("torch", "numpy", "IPython", "ipywidgets", "ipykernel", "traitlets", "pygments", "rich",
         "accelerate", "ray", "transformers", "lightning", "torch_xla", "psutil", "tqdm", "pandas",
         "matplotlib", "jupyter_client", "zmq")

# Modules that are torch's own machinery by design: multi-node launches run on torch elastic's
# agent and rendezvous (subclasses of torch's classes); nothing imports them before such a launch.
TORCH_BOUND = {
    "notebook_launch.engines.elastic.agent": "subclasses torch elastic's agent",
    "notebook_launch.engines.elastic.rendezvous": "torch elastic's rendezvous handlers",
}

HEAVY_CHECK = textwrap.dedent(f"""
    import sys
    HEAVY = {HEAVY!r}

    def heavy():
        return [name for name in HEAVY if name in sys.modules]

    assert heavy() == [], ("the interpreter is not bare", heavy())
""")


def run_fresh(script: str, tmp_path, timeout: int = 300) -> str:
    """``script`` in a new interpreter with this tree first on the path; its stdout."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               NOTEBOOK_LAUNCH_LOG_DIR=str(tmp_path / "runs"))
    done = subprocess.run([sys.executable, "-c", HEAVY_CHECK + textwrap.dedent(script)], capture_output=True,
                          text=True, env=env, cwd=str(tmp_path), timeout=timeout, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


USER_IMPORTS = [
    "import notebook_launch",
    "from notebook_launch import notebook_launcher, start_ranks",
    "from notebook_launch import (notebook_launcher, RayCluster, start_ranks, Ranks, progress, load_metrics, "
    "NotebookLaunchError, LaunchError, GuardError, LaunchArgumentError, load_ipython_extension, install_hooks)",
    "import notebook_launch.magics.launch",
    "import notebook_launch.magics.ranks",
    "from notebook_launch.rank.reports.progress import progress",
    "import notebook_launch.cli",
]


@pytest.mark.parametrize("statement", USER_IMPORTS)
def test_what_a_user_imports_imports_nothing_heavy(statement, tmp_path):
    out = run_fresh(f"""
        {statement}
        print("after import:", heavy())
        import numpy   # any heavy module proves the check (torch would cost 2.5 s of CPU per case)
        print("after numpy:", heavy())
    """, tmp_path)
    assert "after import: []" in out, out
    assert "'numpy'" in out.split("after numpy:")[1]   # the same check sees a heavy import


def test_no_module_of_the_package_imports_anything_heavy(tmp_path):
    """Every module, one after another in one bare process; the first that brings a heavy one
    is named. Only the modules that are torch elastic's machinery by design are left out."""
    out = run_fresh(f"""
        import importlib, pkgutil
        import notebook_launch
        TORCH_BOUND = {sorted(TORCH_BOUND)!r}
        checked = 0
        for info in pkgutil.walk_packages(notebook_launch.__path__, "notebook_launch."):
            if info.name in TORCH_BOUND:
                continue
            try:
                importlib.import_module(info.name)
            except ImportError:   # torch_xla, ray parts where they are not installed
                continue
            checked += 1
            if heavy():
                print("heavy after", info.name, heavy())
                break
        else:
            print("checked", checked, "modules: nothing heavy")
        importlib.import_module(TORCH_BOUND[0])
        print("after a torch-bound module:", heavy())
    """, tmp_path)
    assert "nothing heavy" in out, out
    assert int(out.split("checked ")[1].split()[0]) > 50, out
    assert "'torch'" in out.split("after a torch-bound module:")[1]


RANK_REPORT = """
    import os, sys
    from notebook_launch import notebook_launcher

    def rank_heavy():
        return [name for name in HEAVY if name in sys.modules]

    def names_torch():
        inherited = "torch" in sys.modules   # before this rank's own import
        import torch
        return inherited, torch.ones(1).item()
"""


@pytest.mark.parametrize("start_method", ["fork", "spawn", "spawn, start process off"])
def test_a_launch_imports_nothing_heavy_where_the_function_needs_nothing(start_method, tmp_path):
    """The notebook imports nothing heavy for a launch that needs nothing. Forked ranks import
    nothing either; ranks forked from the warm start process find what it imported once (torch,
    shared with it, at no cost to them); fresh Pythons (the start process off) import nothing."""
    switch = "os.environ['NOTEBOOK_LAUNCH_START_PROCESS'] = '0'" if "off" in start_method else "pass"
    method = start_method.split(",")[0]
    out = run_fresh(RANK_REPORT + f"""
    if __name__ == "__main__":
        {switch}
        ranks = notebook_launcher(rank_heavy, num_processes=2, ui="none", start_method={method!r})
        print("ranks:", ranks, "notebook:", heavy())
        print("torch ranks:", notebook_launcher(names_torch, num_processes=2, ui="none",
                                                start_method={method!r}))
        print("notebook after torch ranks:", heavy())
    """, tmp_path)
    torch_ranks = out.split("torch ranks:")[1].splitlines()[0]
    after = out.split("notebook after torch ranks:")[1]
    if start_method == "spawn":   # the start process's imports: in the ranks, never in the notebook
        assert "'torch'" in out.split("ranks: ")[1].split(" notebook: ")[0] and " notebook: []" in out, out
        assert torch_ranks.strip() == "[(True, 1.0), (True, 1.0)]", out
        assert after.strip() == "[]", out
        return
    assert "ranks: [[], []] notebook: []" in out, out
    if start_method == "fork":
        # code that names torch: the notebook imports it once before forking, the ranks inherit it
        assert torch_ranks.strip() == "[(True, 1.0), (True, 1.0)]", out
        assert "'torch'" in after, out
    else:
        # spawned ranks import what they need; the notebook still has nothing to import
        assert torch_ranks.strip() == "[(False, 1.0), (False, 1.0)]", out
        assert after.strip() == "[]", out


def test_a_torch_launch_still_wraps_torch_for_the_cuda_witness(tmp_path):
    """The torch imported for the ranks gets the CUDA witnesses before the fork, like torch
    imported by the notebook: a later launch's guards can say where CUDA was touched."""
    out = run_fresh(RANK_REPORT + """
    if __name__ == "__main__":
        notebook_launcher(names_torch, num_processes=1, ui="none", start_method="fork")
        import torch
        print("wrapped:", getattr(torch.cuda._lazy_init, "_notebook_launch_wrapped", False))
    """, tmp_path)
    assert "wrapped: True" in out, out


def test_launch_error_is_child_failed_error_when_torch_comes_after_the_import(tmp_path):
    """Without torch, LaunchError does not need torch's ChildFailedError; code that catches it
    has imported torch by then, and catches the LaunchError of a later launch."""
    out = run_fresh("""
    from notebook_launch import LaunchError, notebook_launcher

    def fails():
        raise ValueError("no")

    if __name__ == "__main__":
        print("torch at import:", heavy())
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        try:
            notebook_launcher(fails, num_processes=1, ui="none")
        except ChildFailedError as err:
            print("caught:", type(err).__name__, isinstance(err, LaunchError), sorted(err.failures))
        print("subclass now:", issubclass(LaunchError, ChildFailedError))
    """, tmp_path)
    assert "torch at import: []" in out, out
    assert "caught: LaunchError True [0]" in out, out
    assert "subclass now: True" in out, out


def test_a_torch_free_process_gets_a_plain_launch_error(tmp_path):
    out = run_fresh("""
    from notebook_launch import LaunchError, notebook_launcher

    def fails():
        raise ValueError("no")

    if __name__ == "__main__":
        try:
            notebook_launcher(fails, num_processes=1, ui="none")
        except LaunchError as err:
            print("caught:", str(err).splitlines()[0], [b.__name__ for b in type(err).__mro__[1:4]])
        print("heavy:", heavy())
    """, tmp_path)
    assert "caught: rank 0 failed: ValueError: no ['NotebookLaunchError', 'RuntimeError', 'Exception']" in out, out
    assert "heavy: []" in out, out


def test_the_installed_torch_build_is_read_without_importing_it(tmp_path):
    from importlib.machinery import ModuleSpec

    from notebook_launch.notebook.cuda_tracking import installed_torch_names_cuda

    def install(version_line: str | None):
        folder = tmp_path / f"torch{abs(hash(version_line))}"
        folder.mkdir()
        if version_line is not None:
            (folder / "version.py").write_text(f"from typing import Optional\n__version__ = '2.1'\n"
                                               f"{version_line}\nhip: Optional[str] = None\n")
        spec = ModuleSpec("torch", None, is_package=True)
        spec.submodule_search_locations = [str(folder)]
        return lambda name: spec

    assert installed_torch_names_cuda(install("cuda: Optional[str] = None")) is False
    assert installed_torch_names_cuda(install("cuda = None")) is False
    assert installed_torch_names_cuda(install("cuda: Optional[str] = '12.1'")) is True
    assert installed_torch_names_cuda(install(None)) is True        # unreadable: ask torch, as before
    assert installed_torch_names_cuda(lambda name: None) is False   # not installed


def test_load_ext_and_a_first_launch_in_a_kernel_import_no_torch(tmp_path):
    """In a real kernel (IPython is there, so its hooks are installed): ``%load_ext`` and a
    first launch import no torch; a later cell that imports torch gets the CUDA witnesses
    installed after it ends, so later cells are seen by line."""
    from helpers.nbutil import make_notebook, run_notebook
    nb = run_notebook(make_notebook(
        HEAVY_CHECK.replace('assert heavy() == [], ("the interpreter is not bare", heavy())', "")
        + "\nkernels_own = set(heavy())   # ipykernel's IPython, traitlets, zmq, psutil...\n"
          "def new():\n    return sorted(set(heavy()) - kernels_own)\nprint('kernel:', 'torch' in kernels_own)",
        "%load_ext notebook_launch",
        "print('after load_ext:', new())",
        "from notebook_launch import notebook_launcher\ndef quick():\n    return 1\n"
        "print(notebook_launcher(quick, num_processes=2, ui='none'), new())",
        "import torch",
        "print('wrapped:', getattr(torch.cuda._lazy_init, '_notebook_launch_wrapped', False), new())",
    ), cwd=str(tmp_path), timeout=300)
    text = ["".join(out.get("text", "") for out in cell.outputs) for cell in nb.cells]
    assert "kernel: False" in text[0], text
    assert "after load_ext: []" in text[2], text
    assert "[1, 1] []" in text[3], text
    assert "wrapped: True ['numpy', 'torch'" in text[5], text   # the check sees torch once the cell imports it


def test_a_text_display_launch_imports_no_html_module(tmp_path):
    """The text display (a plain Python process's default) draws no HTML: its first launch does
    not import the html module (over a millisecond at the end of a first launch in a fresh
    process, when the summary's formatting imported it through the chart code). The same check
    sees it once an HTML chart is drawn."""
    out = run_fresh("""
    from notebook_launch import notebook_launcher

    def nothing():
        return 1

    if __name__ == "__main__":
        notebook_launcher(nothing, num_processes=2, ui="text")
        print("after a text launch:", "html" in sys.modules)
        from notebook_launch.display import curves
        curves._escape("<b>")
        print("after an HTML chart:", "html" in sys.modules)
    """, tmp_path)
    assert "after a text launch: False" in out, out
    assert "after an HTML chart: True" in out, out
