"""scripts/quickstart.sh says which torch it installs, and from where, before it installs it (issue 35: it asked
pip for `torch==2.13.0`, which on a machine without a local CPU wheel is PyPI's CUDA build, several GB, while
the README promised the CPU build). `--plan` runs only that decision and changes nothing, so these tests run
it in each situation: PyTorch's CPU index reachable (a local HTTP server standing in for it), unreachable (the
fallback, said clearly), and a machine with an NVIDIA GPU (a fake nvidia-smi: no GPU here)."""
from __future__ import annotations

import http.server
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "quickstart.sh"
# the project's torch: one file, read by the scripts (and pinned by the notebooks' first cells: test_notebooks.py)
TORCH_PIN = "torch==" + (REPO / "scripts" / "torch-version.txt").read_text().strip()


def plan(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    bare = tmp_path / "bin"           # a PATH entry that shadows any nvidia-smi of the machine
    bare.mkdir(exist_ok=True)
    if not (bare / "nvidia-smi").exists():
        fake_nvidia_smi(bare, gpus=0)
    full = dict(os.environ, PATH=f"{bare}{os.pathsep}{os.environ['PATH']}",
                NOTEBOOK_LAUNCH_VENV=str(tmp_path / "venv"), TORCH_INDEX_TIMEOUT="5", **env)
    proc = subprocess.run(["bash", str(SCRIPT), "--plan"], capture_output=True, text=True, timeout=60, env=full)
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "venv").exists(), "--plan must change nothing"
    return proc


def fake_nvidia_smi(folder: Path, gpus: int, pause: float = 0) -> None:
    """Stands in for the NVIDIA driver's nvidia-smi (there is no GPU on this machine). ``pause``: seconds
    between its lines, each its own write, as a driver that answers slowly."""
    between = f"sleep {pause}\n" if pause else ""
    lines = between.join(f"echo 'GPU {i}: Tesla T4 (UUID: GPU-fake-{i})'\n" for i in range(gpus))
    script = folder / "nvidia-smi"
    # Written by a process of its own: a process forked meanwhile by another thread of this one (a
    # worker's leftover fork helper) would hold the file open for writing, and running it would then
    # fail with "Text file busy" (the CPU path taken instead, seen under xdist).
    subprocess.run(["sh", "-c", 'cat > "$1" && chmod 755 "$1"', "sh", str(script)], check=True, text=True,
                   input="#!/bin/sh\n" + (lines or "echo 'No devices were found'; exit 6\n"))


@pytest.fixture
def cpu_index(tmp_path):
    """A PEP 503 index that answers for torch, standing in for https://download.pytorch.org/whl/cpu."""
    root = tmp_path / "index"
    (root / "torch").mkdir(parents=True)
    (root / "torch" / "index.html").write_text("<html></html>")
    handler = lambda *a: http.server.SimpleHTTPRequestHandler(*a, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()
    thread.join()


def test_without_a_gpu_torch_comes_from_pytorchs_cpu_index(tmp_path, cpu_index):
    proc = plan(tmp_path, TORCH_CPU_INDEX=cpu_index)
    assert proc.stdout.strip() == f"pip install {TORCH_PIN} --index-url {cpu_index}", proc.stdout
    assert "CPU build" in proc.stderr and cpu_index in proc.stderr, proc.stderr


def test_an_unreachable_cpu_index_falls_back_and_says_so(tmp_path):
    unreachable = "http://127.0.0.1:1/whl/cpu"     # nothing listens on port 1: refused at once
    proc = plan(tmp_path, TORCH_CPU_INDEX=unreachable)
    assert proc.stdout.strip() == f"pip install {TORCH_PIN}", proc.stdout
    err = proc.stderr
    assert f"PyTorch's CPU index {unreachable} cannot be reached" in err, err
    assert "Falling back to pip's own index" in err and "CUDA build" in err and "7 GB" in err, err
    assert "TORCH_CPU_INDEX" in err, err                 # and what to do instead


def test_with_an_nvidia_gpu_it_says_the_cuda_builds_size(tmp_path, cpu_index):
    bare = tmp_path / "bin"
    bare.mkdir()
    fake_nvidia_smi(bare, gpus=2)
    proc = plan(tmp_path, TORCH_CPU_INDEX=cpu_index)
    assert proc.stdout.strip() == f"pip install {TORCH_PIN}", proc.stdout
    assert "NVIDIA GPU is here (GPU 0: Tesla T4" in proc.stderr and "CUDA build" in proc.stderr, proc.stderr
    assert "GB to download" in proc.stderr and "GB installed" in proc.stderr, proc.stderr


@pytest.mark.parametrize("gpus", [1, 8])
def test_every_gpu_listed_is_read_before_it_is_searched(tmp_path, cpu_index, gpus):
    """nvidia-smi's list is read whole: a search that stopped at its first line left the fake writing the
    next ones into a closed pipe, and under pipefail its SIGPIPE read as "no GPU" (seen in CI, where a
    two-GPU fake was taken for a CPU machine). The pause makes that ordering certain here."""
    bare = tmp_path / "bin"
    bare.mkdir()
    fake_nvidia_smi(bare, gpus=gpus, pause=0.2)
    proc = plan(tmp_path, TORCH_CPU_INDEX=cpu_index)
    assert proc.stdout.strip() == f"pip install {TORCH_PIN}", proc.stderr
    assert "NVIDIA GPU is here (GPU 0: Tesla T4 (UUID: GPU-fake-0))" in proc.stderr, proc.stderr


def test_numpy_is_installed_before_anything_imports_torch():
    """An `import torch` without numpy warns "Failed to initialize NumPy": the quickstart printed it, as it
    said which torch it had installed (report_torch) before it installed numpy. numpy now comes first."""
    body = SCRIPT.read_text().split('if [ ! -x "$VENV/bin/python" ]', 1)[1]    # the set-up, after --plan
    numpy = body.index('pip-install.sh "$VENV/bin/python" numpy')
    assert numpy < body.index("\n  choose_torch\n") and numpy < body.index("\n  report_torch\n"), body


def test_every_script_takes_torch_from_one_file():
    """setup.sh pinned torch==2.13.0 itself and asked pip's own index for it: on a CPU machine without a local
    wheel that is PyPI's CUDA build (several GB), whereas the quickstart takes the CPU build there. setup.sh
    now installs torch through the quickstart, and no script names a version of the main suite's torch
    but the one file (the torch_xla lane's setup-xla.sh pins its own, older torch beside torch_xla)."""
    for script in (REPO / "scripts").glob("*.sh"):
        if script.name != "setup-xla.sh":
            assert "torch==2" not in script.read_text(), script.name
    assert "scripts/quickstart.sh --install" in (REPO / "scripts" / "setup.sh").read_text()


def _bare_venv(folder: Path) -> Path:
    """A venv of the Python running the tests, with no packages (no pip either: nothing is installed)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=120)
    return folder / "bin" / "python"


def test_missing_test_tools_names_the_test_extra(tmp_path):
    check = [str(REPO / "scripts" / "missing_test_tools.py"), str(REPO / "pyproject.toml")]
    here = subprocess.run([sys.executable, *check], capture_output=True, text=True, timeout=60, check=True)
    assert here.stdout == "", here.stdout          # the venv running these tests has the whole test extra
    bare = subprocess.run([str(_bare_venv(tmp_path / "venv")), *check], capture_output=True, text=True,
                          timeout=60, check=True)
    names = bare.stdout.split()
    assert {"pytest", "pytest-xdist", "ruff", "mypy", "ray"} <= set(names), names


def test_the_quick_loop_on_a_quickstart_venv_says_the_one_command(tmp_path):
    """Right after the quickstart, whose .venv holds the run-time packages only, scripts/test-quick.sh failed
    at once ("No module named pytest", ".venv/bin/ruff: No such file or directory", "quick loop: 0 s"). A
    clone's layout here (the two scripts and pyproject.toml) with a venv of no packages: it says what is
    missing and the one command that adds it, and starts nothing."""
    (tmp_path / "scripts").mkdir()
    for name in ("test-quick.sh", "missing_test_tools.py"):
        shutil.copy(REPO / "scripts" / name, tmp_path / "scripts" / name)
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    _bare_venv(tmp_path / ".venv")
    proc = subprocess.run(["bash", str(tmp_path / "scripts" / "test-quick.sh")], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2, proc
    err = proc.stderr
    assert "quick loop: .venv lacks the test tools (pytest, pytest-timeout, pytest-xdist, " in err, err
    assert "\n    bash scripts/setup.sh\nthen run bash scripts/test-quick.sh again." in err, err
    for raw in ("No module named", "No such file", "quick loop: 0 s"):
        assert raw not in proc.stdout + err, proc
