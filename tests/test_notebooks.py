"""The notebooks in notebooks/ run top to bottom in a real kernel and show what they promise; each one's first
cell (tagged "setup") checks its hardware before it changes anything, installs only what is missing, and stops
the notebook where its hardware is missing or an install fails (issue 35). The tests forbid installs
(NOTEBOOK_LAUNCH_NO_INSTALL=1): what the notebooks need is already here, and the setup cell must see that."""
from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
from pathlib import Path

import nbformat
import pytest
from nbclient.exceptions import CellExecutionError

from helpers.nbutil import cell_text, run_notebook

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = REPO / "notebooks"
ALL = sorted(path.name for path in NOTEBOOKS.glob("*.ipynb"))


@pytest.fixture(autouse=True)
def _no_installs(monkeypatch):
    monkeypatch.setenv("NOTEBOOK_LAUNCH_NO_INSTALL", "1")


def _setup_cell(nb):
    return next(c for c in nb.cells if c.cell_type == "code")


def _installed_nothing(nb) -> None:
    text = cell_text(_setup_cell(nb))
    assert "hardware:" in text and "installed now: nothing (all present)" in text, text


def _outputs(nb) -> str:
    return "\n".join(cell_text(c) for c in nb.cells if c.cell_type == "code")


def _errors(nb):
    return [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
            if o.output_type == "error"]


def test_quickstart_cpu():
    nb = run_notebook(NOTEBOOKS / "quickstart_cpu.ipynb", timeout=300)
    assert not _errors(nb)
    _installed_nothing(nb)
    text = _outputs(nb)
    for rank in (0, 1):
        match = re.search(rf"rank {rank} of 2: final loss ([0-9.]+)", text)
        assert match and float(match.group(1)) < 0.5, text
    assert "same weights on every rank: True" in text
    assert "failed rank: 1" in text
    assert "first line: rank 1 failed: ValueError: rank 1 found a bad batch" in text
    assert "world 2 all_reduce total 3.0" in text


def test_accelerate_training():
    pytest.importorskip("accelerate")
    nb = run_notebook(NOTEBOOKS / "accelerate_training.ipynb", timeout=300)
    assert not _errors(nb)
    _installed_nothing(nb)
    text = _outputs(nb)
    for rank in (0, 1):
        match = re.search(rf"rank {rank}: accuracy ([0-9.]+) on 256 samples, mixed precision bf16", text)
        assert match and float(match.group(1)) > 0.85, text
    assert "same weights on every rank: True" in text
    match = re.search(r"accuracy in the notebook: ([0-9.]+)", text)
    assert match and float(match.group(1)) > 0.85


def test_notebooks_are_stored_without_outputs():
    """Committed notebooks carry no stale outputs: what a reader sees comes from a real run."""
    import nbformat
    for path in NOTEBOOKS.glob("*.ipynb"):
        nb = nbformat.read(str(path), as_version=4)
        nbformat.validate(nb)
        assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), path.name


def test_interactive_ranks():
    nb = run_notebook(NOTEBOOKS / "interactive_ranks.ipynb", timeout=300)
    assert not _errors(nb)
    _installed_nothing(nb)
    text = _outputs(nb)
    assert "2 ranks on notebook (CPU, gloo, fork, persistent)" in text
    first = re.search(r"losses after epoch 1: \[([0-9.]+), ([0-9.]+)\]", text)
    second = re.search(r"losses after epoch 2: \[([0-9.]+), ([0-9.]+)\]", text)
    assert first and second and float(second.group(1)) < float(first.group(1)), text  # the same model trained on
    assert "same weights on every rank: True" in text
    learned = re.search(r"learned weights: \[([-0-9., ]+)\]", text)
    assert learned and abs(float(learned.group(1).split(",")[0]) - 2.0) < 0.2, text
    failing = next(c for c in nb.cells if c.cell_type == "code" and "bad_step" in c.source)
    failing_call = cell_text(failing)
    shown = f"{failing_call}\n--- its outputs, as the kernel sent them ---\n{failing.get('outputs')}"
    assert "failed rank: 1" in failing_call, shown
    still_running = "last line: The ranks are still running, with their state; the next call runs on them."
    assert still_running in failing_call, shown
    assert "training goes on: [" in failing_call, shown
    assert "rank 1 sees total 3.0" in text
    assert "[3.0, 3.0]" in text


@pytest.mark.parametrize("name", ALL)
def test_the_first_cell_checks_the_hardware_then_installs_what_is_missing(name):
    """Every shipped notebook states what it needs, and looks at its hardware before anything it changes."""
    nb = nbformat.read(str(NOTEBOOKS / name), as_version=4)
    setup = _setup_cell(nb)
    assert "setup" in setup.metadata.get("tags", []), name
    source = setup.source
    assert source.startswith("# What this notebook needs: "), name
    assert "NEEDS = {" in source and "NOTEBOOK_LAUNCH_NO_INSTALL" in source, name
    # the hardware is looked at (and reported) before the line that decides what to install
    assert source.index("hardware") < source.index("missing = ["), name
    # nothing else installs: no `%pip` / `!pip` / pip call in a later cell (their failure would not stop the run)
    later = [c.source for c in nb.cells if c.cell_type == "code" and c is not setup]
    assert not [s for s in later if "pip" in s and "install" in s], name


def _setup_then_a_probe(name: str, override: str = ""):
    """The notebook's setup cell (with `override` run just before it decides what to install) and a cell that
    says whether the notebook went on after it, run in a real kernel as Run All does: it stops at an error."""
    nb = nbformat.read(str(NOTEBOOKS / name), as_version=4)
    setup = _setup_cell(nb)
    if override:
        head, tail = setup.source.split("missing = [", 1)
        setup.source = f"{head}{override}\nmissing = [{tail}"
    nb.cells = [setup, nbformat.v4.new_code_cell("print('the notebook went on')")]
    with pytest.raises(CellExecutionError):
        run_notebook(nb, cwd=str(NOTEBOOKS))
    error = [o for o in nb.cells[0].outputs if o.output_type == "error"]
    assert len(error) == 1 and error[0].ename == "NotebookStop", nb.cells[0].outputs
    assert nb.cells[1].get("execution_count") is None and not nb.cells[1].outputs, "the notebook went on"
    shown = "\n".join(error[0].traceback)
    # what to do, without a traceback (IPython 8 names a cell's frame "Cell In[n]", 7.34 "<ipython-input-n-...>")
    assert shown.startswith("STOPPED: ") and "Traceback" not in shown, shown
    assert "Cell In[" not in shown and "<ipython-input-" not in shown, shown
    return nb.cells[0], shown


def test_colab_tpu_stops_without_a_tpu_before_it_changes_anything(monkeypatch):
    """No TPU here: the notebook stops at its first cell saying what to do, before it installs anything (it
    once replaced torch with torch 2.9 + torch_xla + CUDA libraries, 6 GB, and then failed). Installs are
    also forbidden here, so a stop for a missing package instead would fail this test."""
    for name in ("PJRT_DEVICE", "TPU_ACCELERATOR_TYPE", "TPU_NAME", "COLAB_TPU_ADDR", "XRT_TPU_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    setup, shown = _setup_then_a_probe("colab_tpu.ipynb")
    assert "no TPU on this runtime; nothing was installed or changed" in shown, shown
    assert "Runtime > Change runtime type > TPU" in shown, shown
    assert "installing" not in cell_text(setup)


@pytest.mark.skipif(importlib.util.find_spec("torch_xla") is not None, reason="torch_xla is installed here")
def test_colab_tpu_with_a_tpu_installs_the_torch_xla_of_the_torch_that_is_here(monkeypatch):
    """A TPU variable stands in for a TPU runtime (fake: there is no TPU here). The setup cell then wants
    torch_xla matching the installed torch (never another torch); installs are forbidden here, so it stops
    naming what it would install."""
    monkeypatch.delenv("PJRT_DEVICE", raising=False)
    monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v5litepod-1")
    torch_minor = ".".join(importlib.metadata.version("torch").split(".")[:2])
    setup, shown = _setup_then_a_probe("colab_tpu.ipynb")
    assert "hardware: TPU_ACCELERATOR_TYPE" in cell_text(setup)
    assert f"missing ['torch_xla[tpu]~={torch_minor}.0']" in shown, shown
    assert "NOTEBOOK_LAUNCH_NO_INSTALL is set: nothing was installed" in shown, shown


@pytest.mark.parametrize("name", [n for n in ALL if n != "colab_tpu.ipynb"])
def test_a_failed_install_stops_the_notebook(name, monkeypatch):
    """Installs allowed, one package missing whose wheel does not exist: pip fails (at once, without the
    network), and the notebook stops there with pip's error (Kaggle's carried on after a failed %pip)."""
    monkeypatch.delenv("NOTEBOOK_LAUNCH_NO_INSTALL")
    override = 'NEEDS = {"no_such_module_35": "/nonexistent/no_such_package-0.0-py3-none-any.whl"}'
    setup, shown = _setup_then_a_probe(name, override)
    assert "installing: /nonexistent/no_such_package-0.0-py3-none-any.whl" in cell_text(setup)
    assert "pip could not install ['/nonexistent/no_such_package-0.0-py3-none-any.whl']" in shown, shown
    assert "then run this cell again" in shown, shown


@pytest.mark.parametrize("where", ["/kaggle/input/", "/content/"])
def test_every_page_names_the_same_wheel_path(where):
    """The notebooks install the wheel from where the README and the docs tell you to put it (Kaggle's once
    said /kaggle/input/notebook-launch/ while the docs said notebook-launch-wheel)."""
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")), *sorted(NOTEBOOKS.glob("*.ipynb"))]
    paths: dict[str, list[str]] = {}
    for page in pages:
        for found in re.findall(re.escape(where) + r"[\w./-]*\.whl", page.read_text(encoding="utf-8")):
            paths.setdefault(found, []).append(page.name)
    assert len(paths) == 1, paths


# The notebooks that install torch where it is missing (Colab's TPU notebook never installs torch: torch_xla
# must match the torch that is there).
INSTALL_TORCH = [n for n in ALL if n != "colab_tpu.ipynb"]
PROJECT_TORCH = "torch==" + (REPO / "scripts" / "torch-version.txt").read_text().strip()


@pytest.mark.parametrize("name", INSTALL_TORCH)
def test_the_setup_cell_pins_the_projects_torch(name):
    """Their first cell asked pip for an unpinned `torch`: torch 2.15 and 17 nvidia packages on a CPU machine.
    A notebook reads nothing from the repository (on Colab and Kaggle there is none), so it pins the version
    itself, and this keeps it the one scripts/quickstart.sh and scripts/setup.sh install."""
    source = _setup_cell(nbformat.read(str(NOTEBOOKS / name), as_version=4)).source
    assert f'TORCH = "{PROJECT_TORCH}"' in source, name
    assert '"torch": TORCH' in source and '"numpy": "numpy"' in source, name
    assert '"torch": "torch"' not in source, name


def _fake_nvidia_smi(folder: Path, gpus: int) -> None:
    """Stands in for the NVIDIA driver's nvidia-smi (there is no GPU on this machine)."""
    folder.mkdir()
    lines = "".join(f"echo 'GPU {i}: Tesla T4 (UUID: GPU-fake-{i})'\n" for i in range(gpus))
    script = folder / "nvidia-smi"
    script.write_text("#!/bin/sh\n" + (lines or "echo 'No devices were found'; exit 6\n"))
    script.chmod(0o755)


@pytest.mark.parametrize("gpus", [0, 2])
@pytest.mark.parametrize("name", INSTALL_TORCH)
def test_a_missing_torch_is_the_cpu_build_without_a_gpu(name, gpus, tmp_path, monkeypatch):
    """torch missing (its module name changed in the cell: torch itself is here), installs allowed: the cell
    asks pip for the project's torch, from PyTorch's CPU index ($TORCH_CPU_INDEX) where nvidia-smi lists no GPU,
    from pip's own index (the CUDA build) where it lists one. torch==<that version> is installed here, so pip
    only finds it satisfied; no index is read (PIP_NO_INDEX, no pip configuration)."""
    here = importlib.metadata.version("torch").split("+")[0]
    if "torch==" + here != PROJECT_TORCH:   # the hosts' lanes: the host's own torch (Colab's 2.11, Kaggle's 2.10)
        pytest.skip(f"torch {here} here, not the project's {PROJECT_TORCH}: pip would have to download it")
    monkeypatch.delenv("NOTEBOOK_LAUNCH_NO_INSTALL")
    _fake_nvidia_smi(tmp_path / "bin", gpus)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    index = "http://127.0.0.1:1/cpu-index-standin"
    monkeypatch.setenv("TORCH_CPU_INDEX", index)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    nb = nbformat.read(str(NOTEBOOKS / name), as_version=4)
    setup = _setup_cell(nb)
    head, tail = setup.source.split("missing = [", 1)
    setup.source = f'{head}NEEDS = {{"no_such_module_47": NEEDS["torch"]}}\nmissing = [{tail}'
    nb.cells = [setup]
    run_notebook(nb, cwd=str(NOTEBOOKS))
    text = cell_text(nb.cells[0])
    where = "" if gpus else f" --index-url {index}"
    assert f"installing: {PROJECT_TORCH}{where}\n" in text, text
    assert f"installed now: ['{PROJECT_TORCH}']" in text, text
