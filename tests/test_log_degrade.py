"""Logging never kills a healthy run: a full disk under the log folder stops the logging (said
once in the cell) while training goes on; an unwritable default log root falls back to a
temporary folder and says where the logs went."""
import errno
import os
import subprocess
import tempfile
from typing import IO, cast

import pytest

from helpers.rank_logs import written_by_rank

from notebook_launch import LaunchArgumentError, notebook_launcher
from notebook_launch.record.logs import RunLogs


def chatty(lines):
    for i in range(lines):
        print(f"line {i:06d} " + "x" * 200)
    return int(os.environ["RANK"])


@pytest.fixture
def full_disk(tmp_path):
    """A 64 KiB tmpfs: the real 'No space left on device' (needs root and mount)."""
    mount_point = tmp_path / "tiny"
    mount_point.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount_point)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.strip() or proc.returncode}); "
                    f"test_disk_full_file_object_stands_in covers the logic")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def test_a_full_disk_stops_logging_not_the_run(full_disk, capsys):
    results = notebook_launcher(chatty, args=(3000,), num_processes=2, log_dir=str(full_disk / "logs"))
    assert results == [0, 1], "training must go on when the log folder's disk is full"
    out = capsys.readouterr()
    said = (out.out + out.err).count("stopped writing the logs")
    assert said == 1, out.out[-3000:] + out.err[-3000:]
    assert "No space left on device" in out.out + out.err


def test_a_full_default_root_is_still_bounded_when_the_run_falls_back(full_disk, monkeypatch, capsys):
    """The earlier runs' folders are bounded beside the ranks (run_folders.Pruning); where this run's
    folder cannot even be made there (a disk our old runs filled), they are bounded before the run
    falls back to the temporary folder, which is often on the same disk."""
    old = full_disk / "runs" / "20260101-000000-0000000001"
    old.mkdir(parents=True)
    with open(old / "rank0.log", "wb", buffering=0) as log:   # every byte the tmpfs holds
        with pytest.raises(OSError) as full:
            while True:
                log.write(b"x" * 4096)
    assert full.value.errno == errno.ENOSPC
    monkeypatch.setenv("NOTEBOOK_LAUNCH_LOG_DIR", str(full_disk / "runs"))
    monkeypatch.setenv("NOTEBOOK_LAUNCH_KEEP_RUNS", "0")
    assert notebook_launcher(chatty, args=(1,), num_processes=1) == [0]
    assert "cannot write logs under" in capsys.readouterr().out
    assert not old.exists(), "the earlier run over the bound is removed all the same"


class DiskFullFile:
    """Stands in for a log file on a full disk: every write and flush raises ENOSPC."""
    def __init__(self):
        self.closed = False

    def write(self, text):
        raise OSError(errno.ENOSPC, "No space left on device")

    def flush(self):
        raise OSError(errno.ENOSPC, "No space left on device")

    def close(self):
        self.closed = True
        raise OSError(errno.ENOSPC, "No space left on device")


def test_disk_full_file_object_stands_in(tmp_path):
    notes: list[str] = []
    logs = RunLogs("run", [0, 1], [0, 1], log_dir=str(tmp_path), on_problem=notes.append)
    for local in (0, 1):
        logs._files[local].close()
        logs._files[local] = cast(IO[str], DiskFullFile())   # duck-typed: the calls RunLogs makes
    for _ in range(3):
        logs.write_line(0, "stdout", "hello")
        logs.write_line(1, "stderr", "hello")
    logs.write_block(0, "Traceback ...")
    logs.flush()
    logs.close()
    assert len(notes) == 1 and "No space left on device" in notes[0] and str(tmp_path) in notes[0]


def test_an_unwritable_default_log_root_falls_back_to_a_temp_folder(tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("")      # a regular file as the parent: even root cannot make folders in it
    monkeypatch.setenv("NOTEBOOK_LAUNCH_LOG_DIR", str(blocker / "runs"))
    assert notebook_launcher(chatty, args=(3,), num_processes=2) == [0, 1]
    out = capsys.readouterr().out
    assert f"cannot write logs under {blocker / 'runs'}" in out, out
    launch_line = next(line for line in out.splitlines() if line.startswith("notebook_launch: 2 ranks"))
    run_dir = launch_line.rsplit("logs: ", 1)[1].strip()
    assert run_dir.startswith(tempfile.gettempdir())
    assert "line 000002" in open(os.path.join(run_dir, "rank1.log")).read()


def test_an_unwritable_home_cache_falls_back_too(tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.delenv("NOTEBOOK_LAUNCH_LOG_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    assert notebook_launcher(chatty, args=(1,), num_processes=1) == [0]
    assert "cannot write logs under" in capsys.readouterr().out


def test_an_unwritable_log_dir_you_chose_is_an_argument_error(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(LaunchArgumentError, match="log_dir=.* cannot be used"):
        notebook_launcher(chatty, args=(1,), num_processes=1, log_dir=str(blocker / "logs"))


@pytest.fixture
def small_disk(tmp_path):
    """A 4 MiB tmpfs (needs root and mount)."""
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount_point)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.strip() or proc.returncode})")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def earlier_runs_left(root):
    return sum(1 for name in os.listdir(root) if name.startswith("20260101-"))


def test_a_run_after_one_that_filled_the_disk_logs_every_line(small_disk, monkeypatch, capsys):
    """Issue 43 part 6 (the soak benchmark saw it: a 1 GB run on a 64 MB disk, then a small run): the
    earlier runs filled the disk, so retention must free their room before this run's ranks write. It
    ran beside the ranks, whose first writes met 'No space left on device': the logging stopped and
    the log of the run that came after kept nothing. Now the ranks find the earlier folders gone."""
    root = small_disk / "runs"
    for i in range(300):   # many folders: removing them takes longer than a rank takes to start
        (root / f"20260101-000000-{i:010d}").mkdir(parents=True)
        (root / f"20260101-000000-{i:010d}" / "rank0.log").write_text("x")
    with open(root / "20260101-000000-0000000000" / "rank0.log", "ab", buffering=0) as log:
        with pytest.raises(OSError) as full:
            while True:
                log.write(b"x" * 4096)
    assert full.value.errno == errno.ENOSPC   # as a run that filled it left it: its last lines unwritten
    filler = root / "20260101-000000-0000000000" / "rank0.log"
    os.truncate(filler, filler.stat().st_size - 32 * 1024)   # room for a new folder, not for its lines
    monkeypatch.setenv("NOTEBOOK_LAUNCH_LOG_DIR", str(root))
    monkeypatch.setenv("NOTEBOOK_LAUNCH_KEEP_RUNS", "0")

    def count_then_print(lines):
        left = earlier_runs_left(root)
        chatty(lines)
        return left

    assert notebook_launcher(count_then_print, args=(3000,), num_processes=1, ui="text") == [0], \
        "every earlier run's folder was removed before the rank ran"
    out = capsys.readouterr()
    assert "stopped writing the logs" not in out.out + out.err, out.out[-2000:]
    (folder,) = [p for p in root.iterdir() if not p.name.startswith(".")]
    assert written_by_rank(folder / "rank0.log").count("\n") == 3000


def test_only_a_disk_nearly_full_waits_for_the_rule():
    """Elsewhere the ranks start beside it (test_run_folders: test_the_ranks_start_without_waiting_for_the_rule)."""
    from notebook_launch.record.run_folders import LOW_DISK_BYTES, prune_first
    assert prune_first(0) and prune_first(LOW_DISK_BYTES - 1)
    assert not prune_first(LOW_DISK_BYTES) and not prune_first(None)
