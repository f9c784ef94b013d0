"""The `notebook-launch` console script and `python -m notebook_launch`, run as a user would."""
from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

SCRIPT = Path(sys.executable).parent / "notebook-launch"


def run(*args, entry="script", timeout=300):
    cmd = [str(SCRIPT)] if entry == "script" else [sys.executable, "-m", "notebook_launch"]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("NOTEBOOK_LAUNCH_RANK", None)
    return subprocess.run(cmd + list(args), capture_output=True, text=True, timeout=timeout, env=env)


def test_console_script_is_installed():
    assert SCRIPT.exists(), "pip install -e . should create the notebook-launch console script"


def test_env_reports_versions_devices_and_the_launch_it_would_do():
    proc = run("env")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for name in ("torch", "accelerate", "ipywidgets", "ipykernel"):
        assert f"{name}:" in out and metadata.version(name) in out, name
    assert "torch_xla:" in out                      # named even when not installed
    assert "where:" in out and "cuda gpus:" in out and "cpus:" in out
    assert "backend:        gloo" in out            # no GPU on this machine
    assert "start method:   fork" in out
    assert "num_processes:" in out and "display:" in out


@pytest.mark.parametrize("entry", ["script", "module"])
def test_test_command_passes_with_a_clear_verdict(entry):
    proc = run("test", "-n", "2", entry=entry)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    for check in ("one result per rank", "all_reduce", "all_gather", "output capture",
                  "a failing rank raises LaunchError"):
        assert f"ok    {check}" in out, check
    assert "FAIL" not in out
    assert out.rstrip().splitlines()[-1].startswith("PASSED: 2 rank(s)")


def test_test_command_with_three_ranks():
    proc = run("test", "-n", "3")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASSED: 3 rank(s)" in proc.stdout


def test_test_command_fails_loudly_when_ranks_cannot_finish():
    # A millisecond is far too short to start, connect and all_reduce: the launch times out.
    proc = run("test", "-n", "2", "--timeout", "0.001")
    assert proc.returncode == 1
    assert "FAIL  launch: LaunchError" in proc.stdout and "timed out" in proc.stdout
    verdict = [line for line in proc.stdout.splitlines() if line.startswith("FAILED:")]
    assert verdict and "launch: LaunchError" in verdict[0] and "timed out" in verdict[0], proc.stdout
    assert "PASSED" not in proc.stdout


def test_bad_arguments_name_the_option():
    proc = run("test", "-n", "0")
    assert proc.returncode == 2
    assert "-n/--num-processes" in proc.stderr and "must be a whole number >= 1" in proc.stderr
    proc = run("frobnicate")
    assert proc.returncode == 2 and "invalid choice" in proc.stderr


def test_demo_trains_across_ranks():
    proc = run("demo", "-n", "2", "--steps", "40", "--ui", "text", "--timeout", "240")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "rank 0: final loss" in proc.stdout and "rank 1: final loss" in proc.stdout
    assert "every rank holds the same weights" in proc.stdout


def test_env_preview_is_the_launchers_own_decision(monkeypatch):
    """`notebook-launch env` asks the function the launcher asks (target.launch_target):
    a decision changed there shows in both."""
    from notebook_launch import cli
    from notebook_launch.planning import target as target_module
    calls = []
    real = target_module.launch_target

    def spy(*args, **kwargs):
        found = real(*args, **kwargs)
        calls.append(found)
        return found

    monkeypatch.setattr(target_module, "launch_target", spy)
    preview = cli.launch_preview()
    assert len(calls) == 1
    assert (preview["num_processes"], preview["start_method"], preview["backend"]) == (
        calls[0].num_processes, calls[0].start_method, calls[0].dist_backend)


def test_no_message_suggests_installing_notebook_launch_from_pypi():
    """notebook_launch is not on PyPI: a message saying `pip install 'notebook_launch[ray]'` sends the user to
    an install that fails. Every install hint the package prints (env's report, errors) names what PyPI has,
    or a clone (`pip install '.[ray]'`). The whole class: every string in the package, not only Ray's."""
    import re
    package = Path(__file__).resolve().parent.parent / "notebook_launch"
    wrong = re.compile(r"pip install\W+notebook[_-]launch")
    found = [f"{path.relative_to(package.parent)}:{number}: {line.strip()}"
             for path in sorted(package.rglob("*.py"))
             for number, line in enumerate(path.read_text().splitlines(), 1) if wrong.search(line)]
    assert not found, "\n".join(found)


def test_env_without_ray_says_how_to_install_it(monkeypatch):
    """Ray is installed in this venv, so its absence is faked (only the version lookup says it is missing)."""
    from notebook_launch.engines.ray import connect as ray_connect

    real = metadata.version

    def version_without_ray(name):
        if name == "ray":
            raise metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(metadata, "version", version_without_ray)
    report = ray_connect.environment_report()
    assert report.startswith("not installed") and "pip install 'ray[default]'" in report, report
