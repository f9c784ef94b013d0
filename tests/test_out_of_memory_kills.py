"""A SIGKILL is called out of memory only where the kernel's own records say so, in the same words
on every path (issue 44 part 2): a launch's rank, a persistent rank during a call and between calls
(the call's headline and its closing line agree), a rank's DataLoader worker; and a rank's peak
memory is its own, not a child's it reaped. The OOM kills are real: a process joins a small memory
cgroup (``helpers.memory_cgroup``) and the kernel's OOM killer ends it."""
import os
import re
import resource
import signal
import time
from typing import cast

import pytest

from notebook_launch import LaunchError, notebook_launcher, start_ranks
from notebook_launch.planning.net import free_port
from notebook_launch.supervise import kernel_oom
from helpers.memory_cgroup import fill, join_and_fill, kernel_log_readable, memory_cgroup
from helpers.panel_helpers import KeepStateDisplay
from helpers.processes import children
from helpers.waiting import ended, wait_for

pytestmark = pytest.mark.timeout(180)
MiB = 1 << 20
LIMIT = 96 * MiB          # the cgroup a process is OOM-killed in
MORE_THAN_THE_RANK = 128 * MiB   # what a rank's child touches beyond the rank's own peak, before it is killed
NOT_OOM = "(not by the kernel's out-of-memory killer: "


def rank() -> int:
    return int(os.environ["RANK"])


@pytest.fixture
def small_cgroup():
    with memory_cgroup(LIMIT) as path:
        yield path


@pytest.fixture(params=["readable", "unreadable"])
def kernel_log(request, monkeypatch):
    """The kernel log as it is here (readable: it names the killed pid), or as in most containers
    (unreadable: the cgroup's and the machine's counters alone decide)."""
    if request.param == "unreadable":
        monkeypatch.setattr(kernel_oom, "kernel_log_kills", lambda since: None)
    elif not kernel_log_readable():
        pytest.skip("the kernel log cannot be read here")
    return request.param


def assert_no_children():
    assert wait_for(lambda: children() == [], timeout=10)


# --- a rank's DataLoader worker --------------------------------------------------------------

class FillsInCgroup:
    """A map-style dataset whose worker joins the memory cgroup and fills it (torch's DataLoader
    takes any object with __len__ and __getitem__)."""

    def __init__(self, cgroup: str) -> None:
        self.cgroup = cgroup

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> int:
        join_and_fill(self.cgroup)
        return index


def worker_oom_killed(cgroup: str) -> None:
    if rank() == 1:
        import torch.utils.data
        dataset = cast("torch.utils.data.Dataset[int]", FillsInCgroup(cgroup))
        for _ in torch.utils.data.DataLoader(dataset, num_workers=1):
            pass
    time.sleep(120)


def test_a_dataloader_worker_the_oom_killer_killed_is_named(log_dir, small_cgroup, kernel_log):
    with pytest.raises(LaunchError) as info:
        notebook_launcher(worker_oom_killed, args=(small_cgroup,), num_processes=2, log_dir=log_dir)
    text = str(info.value)
    first = text.splitlines()[0]
    assert first.startswith("rank 1 failed: RuntimeError: DataLoader worker (pid"), first
    worker = re.search(r"pid(?:\(s\))? (\d+)", first)
    assert worker is not None
    if kernel_log == "readable":
        assert (f"rank 1's process {worker.group(1)} (named in its error: a DataLoader worker or another process "
                f"it started) was killed by the kernel's out-of-memory killer: the kernel log records the kill of "
                f"its process (pid {worker.group(1)}); the limit was its memory cgroup's") in text
        assert re.search(r"It held [\d.]+ [KMG]iB when it was killed \(the kernel log\)", text)
    else:   # the worker left the rank's cgroup: only the machine's count says it, "probably"
        assert f"rank 1's process {worker.group(1)} (named in its error" in text
        assert "was probably killed by the kernel's out-of-memory killer" in text
    assert "What held memory" in text and "fewer DataLoader workers (num_workers)" in text
    assert_no_children()


def worker_killed_by_hand() -> None:
    if rank() == 1:
        import torch.utils.data
        dataset = cast("torch.utils.data.Dataset[int]", KilledByHand())
        for _ in torch.utils.data.DataLoader(dataset, num_workers=1):
            pass
    time.sleep(120)


class KilledByHand:
    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> int:
        os.kill(os.getpid(), signal.SIGKILL)
        return index


def test_a_dataloader_worker_killed_by_hand_is_not_called_out_of_memory(log_dir):
    with pytest.raises(LaunchError) as info:
        notebook_launcher(worker_killed_by_hand, num_processes=2, log_dir=log_dir)
    text = str(info.value)
    assert text.startswith("rank 1 failed: RuntimeError: DataLoader worker (pid")
    assert "out-of-memory killer" not in text and "out of memory" not in text
    assert_no_children()


# --- a rank's child its error does not name -------------------------------------------------

# The child joins the cgroup, waits until the notebook's sampler has seen it there (``seen``: what
# each walk of the ranks' trees found, written by the test), then fills the cgroup.
OOM_CHILD = """
import os, sys, time
cgroup, seen, pid_file, mode = sys.argv[1:]
with open(pid_file, "w") as file:
    file.write(str(os.getpid()))
with open(f"{cgroup}/cgroup.procs", "w") as file:
    file.write(str(os.getpid()))
start = os.path.getsize(seen)
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    with open(seen) as file:
        file.seek(start)
        if f" {os.getpid()} " in file.read():
            break
    time.sleep(0.05)
if mode == "by hand":
    os.kill(os.getpid(), 9)
hog = []
while True:
    hog.append(b"\\x01" * (8 << 20))
"""


def child_killed(cgroup: str, seen: str, pid_file: str, mode: str) -> None:
    if rank() == 1:
        import subprocess
        import sys
        subprocess.run([sys.executable, "-c", OOM_CHILD, cgroup, seen, pid_file, mode], check=True)
    time.sleep(120)


def launch_with_a_child_killed(tmp_path, log_dir, cgroup, mode, monkeypatch) -> tuple[str, int]:
    """The launch's error, and the child's pid; every walk of the ranks' trees noted in ``seen``."""
    from notebook_launch.supervise import oom
    seen, pid_file = tmp_path / "seen", tmp_path / "child.pid"
    seen.write_text("")
    walk = oom.descendants

    def noting(pid: int) -> list[int]:
        found = walk(pid)
        with open(seen, "a") as file:
            file.write(" " + " ".join(map(str, found)) + " \n")
        return found

    monkeypatch.setattr(oom, "descendants", noting)
    with pytest.raises(LaunchError) as info:
        notebook_launcher(child_killed, args=(cgroup, str(seen), str(pid_file), mode), num_processes=2,
                          log_dir=log_dir)
    return str(info.value), int(pid_file.read_text())


def test_a_child_the_oom_killer_killed_is_named_though_the_error_names_no_pid(tmp_path, log_dir, small_cgroup,
                                                                                kernel_log, monkeypatch):
    """``subprocess.run``'s CalledProcessError carries no pid: the child is known as the rank's from
    the sampler's walks of its tree, and named with its command (issue 44)."""
    text, child = launch_with_a_child_killed(tmp_path, log_dir, small_cgroup, "fill", monkeypatch)
    assert text.startswith("rank 1 failed: CalledProcessError: Command"), text
    assert re.search(rf"rank 1's process {child} \(python[\d.]*, a process the rank started; "
                     r"its error names no pid\) was killed by the kernel's out-of-memory killer: ", text), text
    if kernel_log == "readable":
        assert f"the kernel log records the kill of its process (pid {child}); the limit was its memory cgroup's" \
            in text
    else:
        assert f"its memory cgroup ({small_cgroup}) counted 1 OOM kill(s)" in text
    assert "What held memory" in text
    assert_no_children()


def test_a_child_killed_by_hand_whose_pid_the_error_does_not_name_is_not_called_out_of_memory(
        tmp_path, log_dir, small_cgroup, monkeypatch):
    text, child = launch_with_a_child_killed(tmp_path, log_dir, small_cgroup, "by hand", monkeypatch)
    assert text.startswith("rank 1 failed: CalledProcessError: Command"), text
    assert "out-of-memory killer" not in text and str(child) not in text.split("Traceback")[0], text
    assert_no_children()


# --- a rank's peak is its own ----------------------------------------------------------------

def kill_a_big_child_then_raise(figures: str) -> None:
    """Rank 1 forks a child that touches more than the rank's own peak (by MORE_THAN_THE_RANK), kills
    it (SIGKILL, as the OOM killer would) and reaps it, then raises; it writes its own peak and the
    child's first."""
    if rank() == 1:
        size = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 + MORE_THAN_THE_RANK
        ready_r, ready_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            block = bytearray(size)
            block[::4096] = b"\1" * len(range(0, size, 4096))
            os.write(ready_w, str(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024).encode())
            time.sleep(120)
            os._exit(0)
        child_peak = int(os.read(ready_r, 64))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        with open(figures, "w") as file:
            file.write(f"{own} {child_peak}")
        raise ValueError("after the child")
    time.sleep(120)


def test_a_ranks_peak_memory_is_its_own_not_a_killed_childs(log_dir, tmp_path):
    display = KeepStateDisplay()
    figures = tmp_path / "figures"
    with pytest.raises(LaunchError):
        notebook_launcher(kill_a_big_child_then_raise, args=(str(figures),), num_processes=2, log_dir=log_dir,
                          ui=display)
    own, child_peak = map(int, figures.read_text().split())
    assert child_peak > own + 64 * MiB, "the child must hold clearly more than the rank for this test to tell"
    usage = display.state.ranks[1].resources
    assert usage is not None
    assert usage.peak_rss < own + 32 * MiB, (usage.peak_rss, own, child_peak)
    assert_no_children()


# --- persistent ranks: during a call, between calls ------------------------------------------

def kill_rank_1_by_hand() -> None:
    if rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(30)


def oom_kill_rank_1(cgroup: str) -> None:
    if rank() == 1:
        join_and_fill(cgroup)
    time.sleep(30)


def join_then_fill_when_told(cgroup: str, go: str) -> None:
    """Rank 0 joins the cgroup now and fills it once ``go`` exists (after this call returned)."""
    import threading
    if rank() != 0:
        return
    with open(f"{cgroup}/cgroup.procs", "w") as file:
        file.write(str(os.getpid()))

    def fill_when_told() -> None:
        while not os.path.exists(go):
            time.sleep(0.01)
        fill()
    threading.Thread(target=fill_when_told, daemon=True).start()


def noop() -> int:
    return rank()


@pytest.fixture
def ranks(log_dir):
    with start_ranks(2, ui="none", log_dir=log_dir, interrupt_grace=2.0, use_port=free_port()) as pool:
        yield pool
    assert_no_children()


def closing_line(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("Every rank was stopped because"))


def test_a_persistent_rank_killed_by_hand_is_said_so_in_headline_and_closing_line(ranks):
    with pytest.raises(LaunchError) as info:
        ranks.run(kill_rank_1_by_hand)
    text = str(info.value)
    assert text.startswith(f"rank 1 failed: killed by SIGKILL {NOT_OOM}"), text
    assert closing_line(text).startswith(f"Every rank was stopped because rank 1 died (killed by SIGKILL {NOT_OOM}")
    assert "possibly out of memory" not in text


def test_a_persistent_rank_the_oom_killer_killed_is_said_so_in_headline_and_closing_line(
        ranks, small_cgroup, kernel_log):
    with pytest.raises(LaunchError) as info:
        ranks.run(oom_kill_rank_1, args=(small_cgroup,))
    text = str(info.value)
    # where the kernel log cannot be read and no sample saw rank 1 join the cgroup before it died, only
    # the machine's count says it: "probably"; never "not", and the closing line says what the headline says
    said = re.match(r"rank 1 failed: ((probably )?killed by the kernel's out-of-memory killer \(SIGKILL\))$",
                    text.splitlines()[0])
    assert said is not None, text
    assert kernel_log == "unreadable" or not said.group(2)
    assert closing_line(text).startswith(f"Every rank was stopped because rank 1 died ({said.group(1)})")
    assert re.search(r"rank 1 was (probably )?killed by the kernel's out-of-memory killer", text)
    assert "possibly out of memory" not in text


def test_a_persistent_rank_killed_by_hand_between_calls_is_not_called_out_of_memory(ranks, capsys):
    ranks.run(noop)
    pid = ranks.pids[0]
    os.kill(pid, signal.SIGKILL)
    assert wait_for(lambda: ended(pid))
    capsys.readouterr()
    assert ranks.run(noop) == [0, 1]
    out = capsys.readouterr().out
    assert f"local rank 0 ended between calls (killed by SIGKILL {NOT_OOM}" in out, out
    assert "possibly out of memory" not in out


def test_a_persistent_rank_the_oom_killer_killed_between_calls_is_named(ranks, small_cgroup, kernel_log,
                                                                         tmp_path, capsys):
    go = tmp_path / "go"
    ranks.run(join_then_fill_when_told, args=(small_cgroup, str(go)))
    pid = ranks.pids[0]
    go.touch()   # the call is over: rank 0 fills its cgroup between calls
    assert wait_for(lambda: ended(pid))
    capsys.readouterr()
    assert ranks.run(noop) == [0, 1]
    out = capsys.readouterr().out
    assert "local rank 0 ended between calls (killed by the kernel's out-of-memory killer (SIGKILL))" in out, out
