"""Installing notebook_launch on Colab or Kaggle changes nothing the host pins.

A hosted notebook's kernel runs on the packages its image pins (Colab: IPython 7.34.0, held there by the
google-colab package; ipykernel 6.17.1; torch 2.11; ...). A ``pip install notebook_launch`` that upgraded one
of them would swap it under the running kernel. This test installs the wheel built from this checkout into a
venv holding the host's pin list (hosts/colab.txt, hosts/kaggle.txt) with the host's own pip, as a user's
``!pip install`` cell would, and compares ``pip freeze`` before and after: the only change allowed is
notebook_launch itself, added. Then the installed wheel runs its self-test (two ranks) on those pins.

It runs in the hosted lanes (scripts/test-colab.sh, scripts/test-kaggle.sh), which build the pinned venv
and name it in NOTEBOOK_LAUNCH_HOST_PINS_VENV; the venv is copied with hard links (seconds, no second 5 GB)
and the copy changed, never the original.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HOST = os.environ.get("NOTEBOOK_LAUNCH_HOST", "")
PINS_VENV = os.environ.get("NOTEBOOK_LAUNCH_HOST_PINS_VENV", "")

pytestmark = pytest.mark.skipif(
    not (HOST and PINS_VENV), reason="runs in the Colab and Kaggle lanes (scripts/test-colab.sh, "
    "scripts/test-kaggle.sh), which build a venv holding the host's pins")


def _run(argv: list[str], cwd: Path, timeout: float = 600, env: dict | None = None) -> str:
    done = subprocess.run(argv, cwd=str(cwd), capture_output=True, text=True, timeout=timeout, env=env)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{' '.join(argv)} exited with {done.returncode}:\n{output[-4000:]}"
    return output


def _clean_env() -> dict:
    """A user's shell: no venv or PYTHONPATH of this checkout."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "NOTEBOOK_LAUNCH_HOST_PINS_VENV")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def _pin_file() -> tuple[dict[str, str], str | None]:
    """{normalized name: version} of hosts/<host>.txt, and the host's pip version (its ``# pip:`` line)."""
    pins: dict[str, str] = {}
    pip_version = None
    for line in (REPO / "hosts" / f"{HOST}.txt").read_text().splitlines():
        found = re.match(r"#\s*pip:\s*(\S+)", line)
        if found:
            pip_version = found.group(1)
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[_normal(name)] = version
    return pins, pip_version


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _freeze(python: Path, cwd: Path) -> dict[str, str]:
    """{normalized name: version or requirement} of everything installed (pip itself aside)."""
    out = _run([str(python), "-m", "pip", "freeze", "--all", "--exclude", "pip"], cwd=cwd, env=_clean_env())
    installed = {}
    for line in out.splitlines():
        if "==" in line:
            name, version = line.split("==", 1)
        elif " @ " in line:
            name, version = line.split(" @ ", 1)
        else:
            continue
        installed[_normal(name.strip())] = version.strip()
    return installed


def _build_wheel(tmp_path: Path) -> Path:
    """The wheel a user would install, built from a copy of what the sdist holds (no build/ left in the
    checkout, which the lanes mount from outside)."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(REPO / name, src / name)
    shutil.copytree(REPO / "notebook_launch", src / "notebook_launch",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path / "dist"), str(src)],
         cwd=tmp_path, env=_clean_env())
    wheels = list((tmp_path / "dist").glob("notebook_launch-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.mark.timeout(1200)
def test_installing_the_wheel_changes_no_pinned_package_and_it_runs_there(tmp_path):
    pins, pip_version = _pin_file()
    wheel = _build_wheel(tmp_path)
    original = Path(PINS_VENV)
    # Beside the original, so the hard links stay on one filesystem.
    venv = original.parent / f"freeze-test-{os.getpid()}"
    shutil.rmtree(venv, ignore_errors=True)
    try:
        _run(["cp", "-al", str(original), str(venv)], cwd=tmp_path)
        python = venv / "bin" / "python"
        if pip_version:
            _run([str(python), "-m", "pip", "install", "-q", f"pip=={pip_version}"], cwd=tmp_path, env=_clean_env())

        before = _freeze(python, tmp_path)
        unpinned = {name: version for name, version in pins.items() if before.get(name) != version}
        assert not unpinned, (f"the {HOST} venv does not hold hosts/{HOST}.txt (pin: installed): "
                              + ", ".join(f"{n}=={v}: {before.get(n)}" for n, v in unpinned.items()))
        assert "notebook-launch" not in before

        # What a user's `!pip install notebook_launch-*.whl` cell does: dependencies resolved by pip.
        log = _run([str(python), "-m", "pip", "install", str(wheel)], cwd=tmp_path, env=_clean_env())
        after = _freeze(python, tmp_path)

        changed = {name: (version, after.get(name)) for name, version in before.items() if after.get(name) != version}
        added = sorted(set(after) - set(before))
        assert not changed, (f"installing the wheel on {HOST}'s pins changed "
                             + ", ".join(f"{n} {old} -> {new}" for n, (old, new) in changed.items())
                             + f"\npip said:\n{log[-3000:]}")
        assert added == ["notebook-launch"], (f"installing the wheel added {added}, not notebook_launch alone:\n"
                                              f"{log[-3000:]}")

        # The installed package, on the host's versions, runs its self-test (two ranks, gloo) from a folder
        # with nothing of this checkout in it.
        env = _clean_env()
        env["NOTEBOOK_LAUNCH_LOG_DIR"] = str(tmp_path / "runs")
        where = _run([str(python), "-c", "import notebook_launch; print(notebook_launch.__file__)"],
                     cwd=tmp_path, env=env)
        assert where.strip().startswith(str(venv)), f"imported from outside the pinned venv: {where}"
        output = _run([str(python), "-m", "notebook_launch", "test"], cwd=tmp_path, env=env, timeout=300)
        assert "PASSED" in output, output[-3000:]
    finally:
        shutil.rmtree(venv, ignore_errors=True)
