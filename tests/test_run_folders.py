"""The run folders under the default log root stay bounded in number and in size, a live run's
folder is never removed, and ``notebook-launch clean`` removes what it says it removes.

Real folders with real bytes in a tmp dir, real launches and a real process holding a run live."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from notebook_launch import LaunchArgumentError, notebook_launcher
from notebook_launch.record import run_folders
from notebook_launch.record.run_folders import (LIVE_FILE, MEGABYTE, LiveRunFolder, Retention, list_run_folders,
                                                live_pid, prune)


def make_runs(root: Path, sizes_kb, start=0) -> list[str]:
    """Finished run folders, oldest first, each holding a rank log of the given size (real bytes)."""
    names = []
    for index, size in enumerate(sizes_kb, start):
        name = f"20260101-{index:06d}-{index:010d}"
        folder = root / name
        folder.mkdir(parents=True)
        (folder / "rank0.log").write_bytes(b"x" * (size * 1000))
        names.append(name)
    return names


def names_in(root: Path) -> list[str]:
    return sorted(os.listdir(root))


def wait_for(condition, what: str, limit: float = 120.0) -> None:
    """Wait for a condition another process brings about (not a timing: the limit only ends a hang)."""
    deadline = time.monotonic() + limit
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.05)


def test_the_count_bound_removes_the_oldest_runs(tmp_path):
    names = make_runs(tmp_path, [1] * 6)
    removed = prune(tmp_path, Retention(keep_runs=4))
    assert [f.name for f in removed] == names[:2]
    assert names_in(tmp_path) == names[2:]


def test_the_size_bound_removes_the_oldest_runs_until_the_rest_fit(tmp_path):
    names = make_runs(tmp_path, [1000, 10, 1000, 1000])   # one small run among 1 MB ones
    sizes = {f.name: f.size for f in list_run_folders(tmp_path)}
    bound = sizes[names[2]] + sizes[names[3]] + 1
    removed = prune(tmp_path, Retention(keep_runs=100, keep_bytes=bound))
    # oldest first until the rest fit: the small one goes too, though it would fit by itself
    assert [f.name for f in removed] == names[:2]
    assert names_in(tmp_path) == names[2:]
    assert sum(f.size for f in list_run_folders(tmp_path)) <= bound


def test_both_bounds_hold_together(tmp_path):
    names = make_runs(tmp_path, [10] * 5 + [2000])   # the newest run alone is over 1 MB
    prune(tmp_path, Retention(keep_runs=3, keep_bytes=MEGABYTE))
    assert names_in(tmp_path) == [], "count says keep 3, size says none of them fits"
    names = make_runs(tmp_path, [10] * 5)
    prune(tmp_path, Retention(keep_runs=3, keep_bytes=MEGABYTE))
    assert names_in(tmp_path) == names[2:]


def test_only_run_folders_are_touched(tmp_path):
    names = make_runs(tmp_path, [10, 10])
    (tmp_path / "my-notes").mkdir()
    (tmp_path / "20260101-notes").mkdir()
    (tmp_path / "19990101-000000-1.txt").write_text("a file named like a run")
    prune(tmp_path, Retention(keep_runs=0, keep_bytes=0))
    assert names_in(tmp_path) == ["19990101-000000-1.txt", "20260101-notes", "my-notes"]
    assert not set(names) & set(names_in(tmp_path))


LIVE_RUN = textwrap.dedent("""
    import os, sys, time
    from notebook_launch import notebook_launcher

    def wait(marker):
        open(f"{marker}.{os.environ['RANK']}", "w").close()
        while not os.path.exists(marker + ".go"):
            time.sleep(0.05)
        return int(os.environ["RANK"])

    print(notebook_launcher(wait, args=(sys.argv[1],), num_processes=2, ui="none"), flush=True)
""")


def test_a_live_runs_folder_is_kept_whatever_the_bounds(tmp_path):
    root = tmp_path / "runs"
    old = make_runs(root, [10, 10, 10])
    marker = str(tmp_path / "marker")
    env = dict(os.environ, NOTEBOOK_LAUNCH_LOG_DIR=str(root))
    notebook = subprocess.Popen([sys.executable, "-c", LIVE_RUN, marker], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: all(os.path.exists(f"{marker}.{rank}") for rank in (0, 1)), "both ranks running")
        live = [name for name in names_in(root) if name not in old]
        assert len(live) == 1, names_in(root)
        assert live_pid(root / live[0]) == notebook.pid
        assert [f.name for f in prune(root, Retention(keep_runs=0, keep_bytes=0))] == old
        assert names_in(root) == live, "the live run's folder stays, the finished ones go"
        open(marker + ".go", "w").close()
        output = notebook.communicate(timeout=120)[0]
        assert notebook.returncode == 0 and "[0, 1]" in output, output
    finally:
        if notebook.poll() is None:
            notebook.kill()
            notebook.wait()
    assert (root / live[0] / "rank1.log").exists() and not (root / live[0] / LIVE_FILE).exists()
    assert live_pid(root / live[0]) is None, "a finished run is not live"
    assert [f.name for f in prune(root, Retention(keep_runs=0, keep_bytes=0))] == live


def test_a_killed_run_is_not_live(tmp_path):
    """The lock is the kernel's: a run whose process was killed holds nothing, though its .live stays."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; "
         "from notebook_launch.record.run_folders import LiveRunFolder; "
         "held = LiveRunFolder(Path(sys.argv[1]), '20260101-000000-0000000001'); print('ready', flush=True); "
         "time.sleep(600)", str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None
    try:
        assert holder.stdout.readline().strip() == "ready"
        folder = tmp_path / "20260101-000000-0000000001"
        assert live_pid(folder) == holder.pid
        assert prune(tmp_path, Retention(keep_runs=0, keep_bytes=0)) == []
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert (folder / LIVE_FILE).exists() and live_pid(folder) is None
    assert [f.name for f in prune(tmp_path, Retention(keep_runs=0, keep_bytes=0))] == [folder.name]


def test_a_folder_is_only_seen_once_locked(tmp_path):
    """Made under a hidden name, locked, then renamed: no listing ever shows it unlocked."""
    live = LiveRunFolder(tmp_path, "20260101-000000-0000000002")
    try:
        assert names_in(tmp_path) == ["20260101-000000-0000000002"]
        assert live_pid(live.path) == os.getpid()
    finally:
        live.release()
        live.release()   # idempotent
    assert live_pid(live.path) is None and names_in(live.path) == []


def test_a_run_applies_the_rule_as_it_starts(tmp_path, monkeypatch):
    root = tmp_path / "runs"
    old = make_runs(root, [10] * 5)
    monkeypatch.setenv("NOTEBOOK_LAUNCH_LOG_DIR", str(root))
    monkeypatch.setenv("NOTEBOOK_LAUNCH_KEEP_RUNS", "2")
    assert notebook_launcher(int, num_processes=1, ui="none") == [0]
    kept = names_in(root)
    assert kept[:2] == old[3:] and len(kept) == 3, "the newest 2 earlier runs and this run's folder"
    assert (root / kept[2] / "rank0.log").exists()
    monkeypatch.setenv("NOTEBOOK_LAUNCH_KEEP_RUNS", "100")
    monkeypatch.setenv("NOTEBOOK_LAUNCH_KEEP_MB", "0.015")   # room for one small run, not two
    assert notebook_launcher(int, num_processes=1, ui="none") == [0]
    assert len(names_in(root)) == 2 and names_in(root)[0] == kept[2]


def test_the_ranks_start_without_waiting_for_the_rule(tmp_path, monkeypatch):
    """Measuring and removing the earlier runs' folders (~15 ms for a hundred, in a kernel's first
    launch) goes on beside the ranks, not before them: here the rule cannot be applied until a rank
    has run the launched function, and the launch still gets there, and returns with the folders
    bounded. Where the rule ran before any rank started, the rank never runs and the wait fails."""
    root = tmp_path / "runs"
    old = make_runs(root, [10] * 5)
    monkeypatch.setenv("NOTEBOOK_LAUNCH_LOG_DIR", str(root))
    monkeypatch.setenv("NOTEBOOK_LAUNCH_KEEP_RUNS", "2")
    marker = tmp_path / "a rank ran"
    pruned_in: list[str] = []
    real_prune = run_folders.prune

    def prune_once_a_rank_ran(*args, **kwargs):
        wait_for(marker.exists, "a rank ran the launched function before the earlier runs were pruned")
        pruned_in.append(threading.current_thread().name)
        return real_prune(*args, **kwargs)

    monkeypatch.setattr(run_folders, "prune", prune_once_a_rank_ran)
    assert notebook_launcher(Path.touch, args=(marker,), num_processes=2, ui="none") == [None, None]
    assert pruned_in == ["notebook_launch-prune"], "the rule runs once per run, in its own thread"
    kept = names_in(root)
    assert kept[:2] == old[3:] and len(kept) == 3, "the newest 2 earlier runs and this run's folder"
    assert "notebook_launch-prune" not in [t.name for t in threading.enumerate()], "the run waited for it"


def test_a_rule_that_fails_does_not_fail_the_run(tmp_path, monkeypatch):
    """A prune that raises is the launch's business no more: it is logged and the run goes on."""
    root = tmp_path / "runs"
    make_runs(root, [10] * 3)
    monkeypatch.setenv("NOTEBOOK_LAUNCH_LOG_DIR", str(root))

    def broken_prune(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(run_folders, "prune", broken_prune)
    assert notebook_launcher(int, num_processes=1, ui="none") == [0]
    assert len(names_in(root)) == 4


@pytest.mark.parametrize("variable,value", [("NOTEBOOK_LAUNCH_KEEP_RUNS", "many"),
                                            ("NOTEBOOK_LAUNCH_KEEP_RUNS", "-1"),
                                            ("NOTEBOOK_LAUNCH_KEEP_MB", "nan"),
                                            ("NOTEBOOK_LAUNCH_KEEP_MB", "-5")])
def test_a_bad_bound_is_named_before_any_rank_starts(tmp_path, monkeypatch, variable, value):
    monkeypatch.setenv(variable, value)
    marker = tmp_path / "ran"
    with pytest.raises(LaunchArgumentError, match=f"{variable}={value!r} is not"):
        notebook_launcher(Path.touch, args=(marker,), num_processes=1, ui="none")
    assert not marker.exists()


# --- notebook-launch clean --------------------------------------------------------------------

def clean(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, NOTEBOOK_LAUNCH_LOG_DIR=str(root))
    return subprocess.run([sys.executable, "-m", "notebook_launch", "clean", *args], capture_output=True,
                          text=True, timeout=120, env=env)


def test_clean_dry_run_says_what_it_would_remove_and_removes_nothing(tmp_path):
    names = make_runs(tmp_path, [1000, 1000, 10])
    proc = clean(tmp_path, "--keep", "1", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    for name in names[:2]:
        assert f"would remove {tmp_path / name}" in proc.stdout
    assert str(tmp_path / names[2]) not in proc.stdout
    assert "Would remove 2 run folder(s)" in proc.stdout and "would free 2.0 MB" in proc.stdout, proc.stdout
    assert names_in(tmp_path) == names


def test_clean_keep_and_max_mb_remove_the_oldest(tmp_path):
    names = make_runs(tmp_path, [1000, 1000, 10, 10])
    proc = clean(tmp_path, "--keep", "3")
    assert proc.returncode == 0 and f"removed {tmp_path / names[0]}" in proc.stdout, proc.stdout
    assert "Removed 1 run folder(s)" in proc.stdout and "freed 1.0 MB" in proc.stdout, proc.stdout
    assert names_in(tmp_path) == names[1:]
    proc = clean(tmp_path, "--max-mb", "0.5")
    assert "Removed 1 run folder(s)" in proc.stdout and names_in(tmp_path) == names[2:], proc.stdout


def test_clean_older_than_uses_the_last_write(tmp_path):
    names = make_runs(tmp_path, [10, 10, 10])
    ten_days_ago = time.time() - 10 * 86400
    for name in names[1:]:   # the oldest by name was written recently: age is the last write
        for path in (tmp_path / name, tmp_path / name / "rank0.log"):
            os.utime(path, (ten_days_ago, ten_days_ago))
    proc = clean(tmp_path, "--older-than", "7")
    assert proc.returncode == 0 and "Removed 2 run folder(s)" in proc.stdout, proc.stdout
    assert names_in(tmp_path) == names[:1]


def test_clean_with_no_option_applies_the_retention_rule(tmp_path):
    names = make_runs(tmp_path, [10] * 4)
    env = dict(os.environ, NOTEBOOK_LAUNCH_LOG_DIR=str(tmp_path), NOTEBOOK_LAUNCH_KEEP_RUNS="3")
    proc = subprocess.run([sys.executable, "-m", "notebook_launch", "clean"], capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 0 and "the retention rule: the newest 3 runs, at most 1024 MB" in proc.stdout
    assert names_in(tmp_path) == names[1:]


def test_clean_all_keeps_a_live_run_and_says_so(tmp_path):
    names = make_runs(tmp_path, [10, 10])
    live = LiveRunFolder(tmp_path, "20260102-000000-0000000009")
    try:
        proc = clean(tmp_path, "--all")
        assert proc.returncode == 0, proc.stderr
        assert f"kept {live.path}: a run still going (pid {os.getpid()})" in proc.stdout, proc.stdout
        assert "Removed 2 run folder(s)" in proc.stdout and "1 kept" in proc.stdout and "1 of them live" in proc.stdout
        assert names_in(tmp_path) == [live.path.name]
    finally:
        live.release()
    assert names and clean(tmp_path, "--all").returncode == 0 and names_in(tmp_path) == []


@pytest.mark.parametrize("args,message", [
    (("--keep", "-1"), "argument --keep: must be a whole number >= 0"),
    (("--max-mb", "lots"), "argument --max-mb: must be a number of megabytes >= 0"),
    (("--older-than", "inf"), "argument --older-than: must be a number of days >= 0"),
])
def test_clean_bad_arguments_exit_2_naming_the_option(tmp_path, args, message):
    proc = clean(tmp_path, *args)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_clean_with_a_bad_bound_in_the_environment_is_a_usage_error(tmp_path):
    env = dict(os.environ, NOTEBOOK_LAUNCH_LOG_DIR=str(tmp_path), NOTEBOOK_LAUNCH_KEEP_MB="big")
    proc = subprocess.run([sys.executable, "-m", "notebook_launch", "clean"], capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 2 and "NOTEBOOK_LAUNCH_KEEP_MB='big' is not" in proc.stderr, proc.stderr
