"""Nothing of a run stays in a shared temp folder, and what it writes is its user's alone (issue 44,
part 5): a spawned persistent run whose notebook was SIGKILLed left ``/tmp/notebook_launch-spawn-*/
job.pkl``, the pickled function with whatever it closes over (a token, a password). Now the job
travels in a file with no name; the run's folders are 0700 and its files 0600, the fallback root
in the temp folder too. The notebook here is a plain Python process (what a kernel is), SIGKILLed
while persistent ranks wait between calls and while a launch runs."""
from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil

SECRET = "hunter2-not-in-any-file"

NOTEBOOK = textwrap.dedent(f"""
    import os, sys, threading, time
    from notebook_launch import notebook_launcher, start_ranks
    token = {SECRET!r}

    def holds_the_secret():
        import time
        time.sleep(600 if token else 0)

    def pid():
        import os
        return os.getpid() if token else None

    ranks = start_ranks(2, start_method="spawn", ui="none")
    pids = ranks.run(pid)
    threading.Thread(target=lambda: notebook_launcher(holds_the_secret, num_processes=2, start_method="spawn",
                                                      ui="none"), daemon=True).start()
    time.sleep(1)
    print("PIDS", *pids, flush=True)
    time.sleep(600)
""")


def test_a_killed_notebook_leaves_nothing_of_its_spawned_runs_in_the_temp_folder(tmp_path):
    temp, cache = tmp_path / "tmp", tmp_path / "cache"
    temp.mkdir()
    env = dict(os.environ, TMPDIR=str(temp), XDG_CACHE_HOME=str(cache))
    env.pop("NOTEBOOK_LAUNCH_LOG_DIR", None)
    notebook = subprocess.Popen([sys.executable, "-c", NOTEBOOK], env=env, stdout=subprocess.PIPE, text=True)
    try:
        lines: list[str] = []
        assert notebook.stdout is not None
        while not (lines and lines[-1].startswith("PIDS")):
            lines.append(notebook.stdout.readline())
            assert lines[-1], f"the notebook ended: {lines}"
        family = [psutil.Process(notebook.pid), *psutil.Process(notebook.pid).children(recursive=True)]
        assert len(family) >= 5, family   # the notebook, the start process, two persistent ranks, the launch's
    finally:
        notebook.send_signal(signal.SIGKILL)
        notebook.wait()
    _, alive = psutil.wait_procs(family, timeout=60)
    assert not alive, f"outlived the notebook: {alive}"
    left = [path for path in temp.rglob("*")]
    holding = [path for path in left if path.is_file() and SECRET.encode() in path.read_bytes()]
    assert not holding, f"the pickled job stayed behind: {holding}"
    assert not [path for path in left if "spawn" in path.name or path.name.endswith(".pkl")], left
    _assert_private(cache / "notebook_launch" / "runs")


def _assert_private(root: Path) -> None:
    """Every run folder under ``root`` 0700, every file in them 0600 (nothing for group or others)."""
    runs = [path for path in root.iterdir() if path.is_dir()]
    assert runs, f"no run folder under {root}"
    for path in [*runs, *(p for run in runs for p in run.rglob("*"))]:
        assert stat.S_IMODE(path.lstat().st_mode) & 0o077 == 0, f"{path}: {oct(path.lstat().st_mode)}"


def test_logs_in_the_fallback_temp_root_are_the_users_alone(tmp_path):
    """The default root cannot be written: the run goes to <temp>/notebook_launch-<uid>/runs, which
    another user could read if it were made with the usual umask; and one that exists with group
    or others' bits (an older version made it) is closed."""
    temp, cache = tmp_path / "tmp", tmp_path / "cache"
    temp.mkdir()
    cache.write_text("a file where the cache folder would be")   # the default root cannot be made
    old = temp / f"notebook_launch-{os.getuid()}"
    old.mkdir(mode=0o755)
    os.chmod(old, 0o755)
    env = dict(os.environ, TMPDIR=str(temp), XDG_CACHE_HOME=str(cache))
    env.pop("NOTEBOOK_LAUNCH_LOG_DIR", None)
    code = "from notebook_launch import notebook_launcher; print(notebook_launcher(print, num_processes=2, ui='none'))"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert stat.S_IMODE(old.stat().st_mode) == 0o700
    assert stat.S_IMODE((old / "runs").stat().st_mode) == 0o700
    _assert_private(old / "runs")


def test_a_shared_temp_root_that_is_not_the_users_own_is_not_written(tmp_path):
    """A link planted where the fallback root goes (another user's, pointing elsewhere): the run's
    logs do not follow it; the launch says where they could not go."""
    temp, cache, elsewhere = tmp_path / "tmp", tmp_path / "cache", tmp_path / "elsewhere"
    temp.mkdir()
    elsewhere.mkdir()
    cache.write_text("not a folder")
    (temp / f"notebook_launch-{os.getuid()}").symlink_to(elsewhere)
    env = dict(os.environ, TMPDIR=str(temp), XDG_CACHE_HOME=str(cache))
    env.pop("NOTEBOOK_LAUNCH_LOG_DIR", None)
    code = "from notebook_launch import notebook_launcher; print(notebook_launcher(print, num_processes=1, ui='none'))"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert not list(elsewhere.rglob("*")), "the run wrote through a link in the shared temp folder"
    assert "is not this user's own folder" in done.stdout + done.stderr, done.stdout + done.stderr
