"""Out-of-memory ends named (issue 34 item 2): a rank the kernel's OOM killer SIGKILLs is said to
be that, with what held the memory and what to do; a plain SIGKILL is not called one; a rank whose
allocation fails names the size it asked and what it held."""
import os
import re
import resource
import signal
import time
import uuid

import pytest

from notebook_launch import LaunchError, notebook_launcher
from notebook_launch.supervise import oom
from helpers.processes import children

CGROUP_V1 = "/sys/fs/cgroup/memory"
CGROUP_LIMIT = 300 << 20
OOM_NAMED = re.compile(r"rank 1 was (probably )?killed by the kernel's out-of-memory killer")


def rank() -> int:
    return int(os.environ["RANK"])


def assert_no_children():
    deadline = time.monotonic() + 5
    while children() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert children() == []


def assert_advice(text: str) -> None:
    assert "start fewer ranks" in text
    assert "load the model in the notebook before the launch" in text
    assert "smaller batch" in text


@pytest.fixture
def memory_cgroup():
    """A v1 memory cgroup of CGROUP_LIMIT bytes (no swap), below this process's own memory cgroup
    (so it stays inside whatever limits this process has); removed afterwards, failed or not."""
    parent = oom.memory_cgroup_of(os.getpid())
    if os.geteuid() != 0 or parent is None or not parent.startswith(CGROUP_V1) \
            or not os.path.exists(f"{parent}/memory.limit_in_bytes"):
        pytest.skip("needs root and the cgroup v1 memory controller")
    path = f"{parent}/notebook-launch-oom-test-{uuid.uuid4().hex[:8]}"
    os.mkdir(path)
    try:
        with open(f"{path}/memory.limit_in_bytes", "w") as file:
            file.write(str(CGROUP_LIMIT))
        if os.path.exists(f"{path}/memory.memsw.limit_in_bytes"):   # no swapping out instead of the kill
            with open(f"{path}/memory.memsw.limit_in_bytes", "w") as file:
                file.write(str(CGROUP_LIMIT))
        yield path
    finally:
        deadline = time.monotonic() + 10
        while True:
            try:
                os.rmdir(path)
                break
            except OSError:   # a task still in it: the launch ends every rank, so it is leaving
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


def oom_in_cgroup(cgroup: str) -> None:
    """Rank 1 joins the memory cgroup, then fills more memory than it allows (touched pages)."""
    if rank() == 1:
        with open(f"{cgroup}/cgroup.procs", "w") as file:
            file.write(str(os.getpid()))
        hog = []
        while True:
            hog.append(b"\x01" * (16 << 20))
    time.sleep(120)


@pytest.mark.parametrize("kernel_log", ["readable", "unreadable"])
def test_rank_killed_by_the_oom_killer_is_named(log_dir, memory_cgroup, kernel_log, monkeypatch):
    if kernel_log == "unreadable":   # as in most containers: the counters alone decide
        monkeypatch.setattr(oom, "kernel_log_kills", lambda since: None)
    elif oom.kernel_log_kills(time.monotonic()) is None:
        pytest.skip("the kernel log cannot be read here")
    with pytest.raises(LaunchError) as info:
        notebook_launcher(oom_in_cgroup, args=(memory_cgroup,), num_processes=2, log_dir=log_dir)
    text = str(info.value)
    first = text.splitlines()[0]
    assert re.match(r"rank 1 failed: (probably )?killed by the kernel's out-of-memory killer \(SIGKILL\)$", first)
    assert OOM_NAMED.search(text)
    if kernel_log == "readable":   # the kernel log names the process, and the cgroup that hit its limit
        assert "rank 1 was killed by the kernel's out-of-memory killer: the kernel log records the kill" in text
        assert f"the limit was its memory cgroup's {memory_cgroup[len(CGROUP_V1):]} (300.0 MiB)" in text
    assert "What held memory" in text
    assert re.search(r"  rank 0: [\d.]+ [KMG]iB\n", text)
    assert re.search(r"  rank 1: [\d.]+ [KMG]iB (when it was killed|when last sampled)", text)
    assert re.search(r"  the notebook: [\d.]+ [KMG]iB\n", text)
    assert re.search(r"  the machine: [\d.]+ GiB in all, [\d.]+ GiB available now", text)
    assert_advice(text)
    assert "rank 0: stopped by notebook_launch" in text
    assert info.value.kind == "signal"
    assert_no_children()
    with open(f"{memory_cgroup}/cgroup.procs") as file:
        assert file.read() == ""


def sigkill_self() -> None:
    if rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(120)


def test_plain_sigkill_is_not_called_out_of_memory(log_dir):
    with pytest.raises(LaunchError) as info:
        notebook_launcher(sigkill_self, num_processes=2, log_dir=log_dir)
    text = str(info.value)
    assert not OOM_NAMED.search(text)
    assert "What held memory" not in text
    first = text.splitlines()[0]
    # where another process on the machine was OOM-killed during the run and the kernel log cannot be
    # read, only "probably" can be said: never a certain OOM kill
    assert first.startswith("rank 1 failed: killed by SIGKILL, not from the kernel's out-of-memory killer") \
        or first.startswith("rank 1 failed: probably killed by the kernel's out-of-memory killer")
    assert info.value.kind == "signal"
    assert_no_children()


def allocate_beyond_rlimit(allocator: str) -> None:
    """Rank 1 limits its address space to what it has now plus 256 MiB, then asks for 4 GiB."""
    if rank() == 1:
        import numpy
        import torch
        with open("/proc/self/statm") as file:
            mapped = int(file.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        resource.setrlimit(resource.RLIMIT_AS, (mapped + (256 << 20), resource.RLIM_INFINITY))
        if allocator == "torch":
            torch.empty(4 << 30, dtype=torch.uint8)
        elif allocator == "numpy":
            numpy.empty(4 << 30, dtype=numpy.uint8)
        else:
            bytearray(4 << 30)
    time.sleep(120)


@pytest.mark.parametrize("allocator", ["torch", "numpy", "python"])
def test_allocation_failure_names_rank_and_size(log_dir, allocator):
    with pytest.raises(LaunchError) as info:
        notebook_launcher(allocate_beyond_rlimit, args=(allocator,), num_processes=2, log_dir=log_dir)
    text = str(info.value)
    assert text.startswith("rank 1 failed: ")
    asked = {"torch": "it asked for 4.0 GiB (4,294,967,296 bytes)",
             "numpy": "it asked for 4.00 GiB (an array of shape (4294967296,))",
             "python": "the size asked is not in the message (Python's MemoryError does not say it)"}[allocator]
    assert f"rank 1 ran out of memory: {asked}" in text
    # what it held when its error was read, or (it ended first) when last sampled
    assert re.search(r"it held [\d.]+ [KMG]iB resident", text)
    assert re.search(r"its address space is limited to [\d.]+ [KMG]iB \(RLIMIT_AS\)", text)
    assert re.search(r"the machine: [\d.]+ GiB in all", text)
    assert_advice(text)
    assert "rank 0: stopped by notebook_launch" in text
    assert_no_children()


# torch's CUDA out-of-memory message (c10/cuda/CUDACachingAllocator.cpp), as torch 2.1+ and torch
# before 2.1 word it: no GPU here, so a rank raises the real exception type with that text
CUDA_MESSAGE = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total capacity of 14.75 GiB of "
                "which 1.06 GiB is free. Including non-PyTorch memory, this process has 13.68 GiB memory in "
                "use. Of the allocated memory 12.50 GiB is allocated by PyTorch, and 1.04 GiB is reserved by "
                "PyTorch but unallocated. If reserved but unallocated memory is large try setting "
                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.")
OLD_CUDA_MESSAGE = ("CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity; "
                    "14.50 GiB already allocated; 3.75 MiB free; 14.70 GiB reserved in total by PyTorch)")


def fake_gpu_out_of_memory() -> None:
    if rank() == 1:
        import torch
        raise torch.cuda.OutOfMemoryError(CUDA_MESSAGE)
    time.sleep(120)


def test_cuda_out_of_memory_named_from_a_fake_gpu_message(log_dir):
    with pytest.raises(LaunchError) as info:
        notebook_launcher(fake_gpu_out_of_memory, num_processes=2, log_dir=log_dir)
    text = str(info.value)
    assert text.startswith("rank 1 failed: OutOfMemoryError: CUDA out of memory.")
    assert ("rank 1 ran out of GPU memory: it asked for 2.00 GiB; GPU 1 has 14.75 GiB in all, 1.06 GiB free; "
            "this rank's process held 13.68 GiB of it (12.50 GiB allocated by PyTorch, 1.04 GiB reserved by "
            "PyTorch but unallocated).") in text
    assert "a smaller batch" in text and "expandable_segments:True" in text
    assert info.value.exc_type == "OutOfMemoryError"
    assert_no_children()


def test_older_torch_cuda_message_is_read():
    text = oom.allocation_text("OutOfMemoryError", OLD_CUDA_MESSAGE, 3, "")
    assert text is not None
    assert text.startswith("rank 3 ran out of GPU memory: it asked for 20.00 MiB; GPU 0 has 15.78 GiB in all, "
                           "3.75 MiB free; PyTorch had 14.50 GiB allocated, 14.70 GiB reserved.")


def test_other_exceptions_are_not_called_out_of_memory():
    assert oom.allocation_text("ValueError", "you asked for too much", 0, "it held 1 GiB") is None
    assert oom.allocation_text("RuntimeError", "Expected all tensors to be on the same device", 0, "") is None


# A notebook (a Python process running a launch) inside a memory cgroup of CGROUP_LIMIT bytes: its
# forked ranks are in it too. Rank 0 fills the cgroup to ~93% and waits for the test's go-ahead.
NOTEBOOK_AT_RISK = """
import os, sys, time
cgroup, go = sys.argv[1], sys.argv[2]
from notebook_launch import notebook_launcher

def fill_then_wait(cgroup, go):
    hog = []
    if os.environ["RANK"] == "0":
        while True:
            with open(cgroup + "/memory.usage_in_bytes") as file:
                if int(file.read()) > 0.93 * {limit}:
                    break
            hog.append(b"\\x01" * (4 << 20))
    deadline = time.monotonic() + 120
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.05)
    return len(hog)

with open(cgroup + "/cgroup.procs", "w") as file:
    file.write(str(os.getpid()))
results = notebook_launcher(fill_then_wait, args=(cgroup, go), num_processes=2, log_dir=sys.argv[3])
print("results", results, flush=True)
""".replace("{limit}", str(CGROUP_LIMIT))


def test_memory_running_out_is_said_before_anything_dies(memory_cgroup, tmp_path):
    import subprocess
    import sys
    go = tmp_path / "go"
    notebook = subprocess.Popen([sys.executable, "-c", NOTEBOOK_AT_RISK, memory_cgroup, str(go),
                                 str(tmp_path / "logs")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    warning = None
    try:
        assert notebook.stderr is not None
        for line in notebook.stderr:   # until the warning (or the notebook's end: then it never came)
            if line.startswith("notebook_launch: memory is running out"):
                warning = line
                break
    finally:
        go.touch()   # the ranks finish either way
        out, _ = notebook.communicate(timeout=300)
    assert warning is not None
    assert re.match(r"notebook_launch: memory is running out: [\d.]+ [KM]iB of 300.0 MiB left on the notebook's "
                    r"memory cgroup; the ranks hold rank 0 [\d.]+ MiB, rank 1 [\d.]+ MiB and the notebook "
                    r"[\d.]+ MiB", warning)
    assert "the kernel's out-of-memory killer would likely pick rank 0 (it holds the most)" in warning
    assert_advice(warning)
    assert notebook.returncode == 0 and "results [" in out   # nothing died: it was said before
    with open(tmp_path / "logs" / "rank1.log") as log_file:
        assert "memory is running out" in log_file.read()


def test_a_rank_read_after_it_ended_or_on_another_machine_says_what_it_held_as_it_raised():
    """The rank's ERROR carries what it held as it raised: a quick rank on a loaded machine ended
    before any sample and before its error was read, and a rank on another machine (Ray, SLURM)
    has no pid here to read; both still say what they held."""
    from notebook_launch import protocol
    try:
        raise MemoryError()
    except MemoryError as exc:
        payload = protocol.error_payload(exc)
    assert payload["resident"] > 1 << 20   # this process: a few MiB at least
    watch = oom.MemoryWatch([(0, 1)])
    assert watch.rank_holding(0, None, 300 << 20) == "it held 300.0 MiB resident when it raised"
    assert watch.rank_holding(0, None) == ""   # never sampled, nothing said: no figure made up
    failure = protocol.Failure.from_payload(0, {"kind": "exception", "type": "MemoryError", "message": "",
                                                "traceback": "", "resident": 300 << 20})
    named = watch.name_allocation_failure(failure, 0, None, 300 << 20)
    assert "rank 1 ran out of memory" in named.memory and "it held 300.0 MiB resident when it raised" in named.memory
