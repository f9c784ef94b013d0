"""The install lines the README gives work: a wheel built with ``python -m build`` installs in a clean
venv (nothing of this checkout on its path) and ``notebook-launch test`` passes from it. The wheel ships
the Apache-2.0 LICENSE that pyproject.toml names, and the version comes from one place
(``notebook_launch/_version.py``): the wheel's metadata and ``notebook_launch.__version__`` agree.

The clean venv gets ``torch==2.13.0`` first (the CPU build these machines have on disk; with no torch
installed, pip would resolve ``torch>=2.4`` to the newest CUDA build), then the wheel with its other
dependencies from the registry, as a user's ``pip install notebook_launch-*.whl`` would.
"""
from __future__ import annotations

import glob
import os
import re
import subprocess
import sys
import zipfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(argv: list[str], cwd: str, env: dict | None = None, timeout: float = 600) -> str:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{' '.join(argv)} exited with {done.returncode}:\n{output[-4000:]}"
    return output


def _clean_env() -> dict:
    """The environment a user's shell would have: no PYTHONPATH or venv of this checkout."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


@pytest.mark.timeout(900)
def test_wheel_installs_in_a_clean_venv_and_its_selftest_passes(tmp_path):
    dist = tmp_path / "dist"
    # sdist first, then the wheel from the unpacked sdist: no stale build/ folder of the checkout leaks in
    _run([sys.executable, "-m", "build", "--outdir", str(dist), REPO], cwd=str(tmp_path), env=_clean_env())
    wheels = glob.glob(str(dist / "notebook_launch-*.whl"))
    assert len(wheels) == 1, os.listdir(dist)
    with zipfile.ZipFile(wheels[0]) as whl:
        names = whl.namelist()
    assert "notebook_launch/__init__.py" in names
    assert not [n for n in names if n.startswith("tests/")], "the wheel must ship the package only"
    licenses = [n for n in names if re.fullmatch(r"notebook_launch-[^/]+\.dist-info/licenses/LICENSE", n)]
    assert licenses, f"the wheel ships no LICENSE: {[n for n in names if 'dist-info' in n]}"
    with zipfile.ZipFile(wheels[0]) as whl:
        license_text = whl.read(licenses[0]).decode()
    with open(os.path.join(REPO, "LICENSE")) as f:
        assert license_text == f.read()
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text

    venv = tmp_path / "venv"
    _run(["python3", "-m", "venv", str(venv)], cwd=str(tmp_path), env=_clean_env())
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    # torch's byte code is not compiled at install (about 4,000 modules, most of this test's CPU): Python compiles
    # what it imports; the wheel under test installs as a user's would, compiled
    _run(pip + ["--no-compile", "torch==2.13.0"], cwd=str(tmp_path), env=_clean_env())
    _run(pip + [wheels[0]], cwd=str(tmp_path), env=_clean_env())

    where = _run([str(venv / "bin" / "python"), "-c", "import notebook_launch; print(notebook_launch.__file__)"],
                 cwd=str(tmp_path), env=_clean_env())
    assert where.strip().startswith(str(venv)), f"imported from outside the clean venv: {where}"
    printed = _run([str(venv / "bin" / "python"), "-c",
                    "import importlib.metadata as m, notebook_launch, notebook_launch._version as v; "
                    "print('VERSIONS', m.version('notebook_launch'), notebook_launch.__version__, v.__version__)"],
                   cwd=str(tmp_path), env=_clean_env())
    versions = [line.split()[1:] for line in printed.splitlines() if line.startswith("VERSIONS ")]
    assert len(versions) == 1 and len(versions[0]) == 3, printed[-2000:]
    assert len(set(versions[0])) == 1, f"metadata, __version__ and _version.py disagree: {versions[0]}"

    env = _clean_env()
    env["NOTEBOOK_LAUNCH_LOG_DIR"] = str(tmp_path / "runs")
    output = _run([str(venv / "bin" / "notebook-launch"), "test"], cwd=str(tmp_path), env=env, timeout=300)
    assert "PASSED" in output, output[-3000:]


def test_the_version_is_written_in_one_place():
    """pyproject.toml reads the version from notebook_launch/_version.py, and no other file of the package or
    pyproject.toml spells a version out: a release changes one line."""
    import tomllib

    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)
    assert "version" in project["project"]["dynamic"] and "version" not in project["project"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "notebook_launch._version.__version__"}
    spelled = []
    for root, _dirs, files in os.walk(os.path.join(REPO, "notebook_launch")):
        for name in files:
            if name.endswith(".py") and name != "_version.py":
                path = os.path.join(root, name)
                with open(path) as f:
                    if re.search(r"^__version__\s*=\s*['\"]", f.read(), re.M):
                        spelled.append(os.path.relpath(path, REPO))
    assert not spelled, f"these set __version__ themselves instead of importing notebook_launch._version: {spelled}"

    import notebook_launch
    from notebook_launch import _version
    assert notebook_launch.__version__ == _version.__version__
