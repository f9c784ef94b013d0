"""Out-of-memory ends named (issue 34 item 2): a rank the kernel's OOM killer SIGKILLs is said to
be that, with what held the memory and what to do; a plain SIGKILL is not called one; a rank whose
allocation fails names the size it asked and what it held."""
import os
import re
import resource
import signal
import time

import pytest

from notebook_launch import LaunchError, notebook_launcher
from notebook_launch.wire import protocol
from notebook_launch.wire.memory_errors import out_of_memory_type
from notebook_launch.supervise import allocation_failure, kernel_oom, oom
from helpers.memory_cgroup import CGROUP_V1, memory_cgroup as make_memory_cgroup
from helpers.processes import children

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
    """A v1 memory cgroup of CGROUP_LIMIT bytes (``helpers.memory_cgroup``)."""
    with make_memory_cgroup(CGROUP_LIMIT) as path:
        yield path


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
        monkeypatch.setattr(kernel_oom, "kernel_log_kills", lambda since: None)
    elif kernel_oom.kernel_log_kills(time.monotonic()) is None:
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
    assert first.startswith("rank 1 failed: killed by SIGKILL (not by the kernel's out-of-memory killer: ") \
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
        elif allocator == "numpy-2d":   # a shape with a space in its text: it was cut at it
            numpy.empty((1 << 16, 1 << 15), dtype=numpy.float16)
        else:
            bytearray(4 << 30)
    time.sleep(120)


@pytest.mark.parametrize("allocator", ["torch", "numpy", "numpy-2d", "python"])
def test_allocation_failure_names_rank_and_size(log_dir, allocator):
    with pytest.raises(LaunchError) as info:
        notebook_launcher(allocate_beyond_rlimit, args=(allocator,), num_processes=2, log_dir=log_dir)
    text = str(info.value)
    assert text.startswith("rank 1 failed: ")
    asked = {"torch": "it asked for 4.0 GiB (4,294,967,296 bytes)",
             "numpy": "it asked for 4.00 GiB (an array of shape (4294967296,) of uint8)",
             "numpy-2d": "it asked for 4.00 GiB (an array of shape (65536, 32768) of float16)",
             "python": "the size asked is not in the message (Python's MemoryError does not say it)"}[allocator]
    assert f"rank 1 ran out of memory: {asked}" in text
    # what it held when its error was read, or (it ended first) when last sampled
    assert re.search(r"it held [\d.]+ [KMG]iB resident", text)
    assert re.search(r"its address space is limited to [\d.]+ [KMG]iB \(RLIMIT_AS\)", text)
    assert re.search(r"the machine: [\d.]+ GiB in all", text)
    assert_advice(text)
    assert "rank 0: stopped by notebook_launch" in text
    assert_no_children()


def raise_value_error_quoting_torchs_allocator() -> None:
    if rank() == 1:
        raise ValueError("batch of 4294967296 rows refused: you tried to allocate 4294967296 bytes")
    time.sleep(120)


def test_a_value_error_that_quotes_torchs_allocator_is_not_called_out_of_memory(log_dir):
    with pytest.raises(LaunchError) as info:
        notebook_launcher(raise_value_error_quoting_torchs_allocator, num_processes=2, log_dir=log_dir)
    text = str(info.value)
    assert text.startswith("rank 1 failed: ValueError: batch of 4294967296 rows refused")
    assert "ran out of memory" not in text and "What to do" not in text
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
    text = allocation_failure.allocation_text("torch.OutOfMemoryError", OLD_CUDA_MESSAGE, 3, "")
    assert text is not None
    assert text.startswith("rank 3 ran out of GPU memory: it asked for 20.00 MiB; GPU 0 has 15.78 GiB in all, "
                           "3.75 MiB free; PyTorch had 14.50 GiB allocated, 14.70 GiB reserved.")


# TensorFlow cannot be installed beside these tests' torch: a class of its module and name stands in
# for its ResourceExhaustedError (known by module and name, never imported)
FakeTensorflowResourceExhausted = type("ResourceExhaustedError", (Exception,),
                                       {"__module__": "tensorflow.python.framework.errors_impl"})


class UsersOwnError(RuntimeError):
    pass


def test_an_exception_is_out_of_memory_by_its_type_never_by_its_text():
    import numpy
    import torch
    cpu_text = ("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you "
                "tried to allocate 4294967296 bytes. Error code 12 (Cannot allocate memory)")
    assert out_of_memory_type(MemoryError()) == "MemoryError"
    assert out_of_memory_type(torch.OutOfMemoryError("CUDA out of memory.")) == "torch.OutOfMemoryError"
    assert out_of_memory_type(torch.cuda.OutOfMemoryError("x")) == "torch.OutOfMemoryError"
    assert out_of_memory_type(RuntimeError(cpu_text)) == "RuntimeError"   # torch's CPU allocator: a bare RuntimeError
    assert out_of_memory_type(FakeTensorflowResourceExhausted("OOM when allocating tensor")) == \
        "tensorflow.python.framework.errors_impl.ResourceExhaustedError"
    try:
        numpy.ones(1 << 62, dtype=numpy.uint8)
    except MemoryError as exc:
        assert out_of_memory_type(exc) == f"{type(exc).__module__}._ArrayMemoryError"
    # the same words in other types are not: a user's check, a library's validation
    assert out_of_memory_type(ValueError(cpu_text)) is None
    assert out_of_memory_type(ValueError("you tried to allocate 4294967296 bytes")) is None
    assert out_of_memory_type(UsersOwnError(cpu_text)) is None
    assert out_of_memory_type(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")) is None
    assert out_of_memory_type(KeyError("Unable to allocate 4.00 GiB for an array with shape (4,)")) is None
    assert allocation_failure.allocation_text(None, cpu_text, 0, "it held 1 GiB") is None


def test_torchs_out_of_memory_is_named_as_itself_not_as_pythons_memory_error():
    import torch
    payload = protocol.error_payload(torch.OutOfMemoryError("XPU out of memory."))
    assert payload["out_of_memory"] == "torch.OutOfMemoryError"
    failure = protocol.Failure.from_payload(0, payload)
    named = oom.MemoryWatch([(0, 1)]).name_failure(failure, 0, None, payload)
    assert "rank 1 ran out of memory: the size asked is not in the message (torch.OutOfMemoryError does not " \
           "say it)" in named.memory
    assert "Python's MemoryError" not in named.memory


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
    from notebook_launch.wire import protocol
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
    named = watch.name_failure(failure, 0, None, {"resident": 300 << 20, "out_of_memory": "MemoryError"})
    assert "rank 1 ran out of memory" in named.memory and "it held 300.0 MiB resident when it raised" in named.memory


def test_a_kernel_counter_is_the_first_line_of_its_name_with_a_number():
    """``kernel_oom.counter`` finds its line by searching (issue 45), as splitting every line did:
    the whole key at a line's start, never a longer key that begins with it, nor a value that is
    not a number; the machine's own /proc/vmstat read the same both ways."""
    text = "oom_kill_extra 7\noom x\noom 2\noom 3\n"
    assert kernel_oom.counter(text, "oom") == 2
    assert kernel_oom.counter(text, "oom_kill") is None
    assert kernel_oom.counter("low 0\nhigh 0\nmax 0\noom 4\noom_kill 5", "oom_kill") == 5
    assert kernel_oom.counter("oom 1", "oom") == 1 and kernel_oom.counter("oom  9 \n", "oom") == 9
    assert kernel_oom.counter("", "oom") is None and kernel_oom.counter(None, "oom") is None
    vmstat = open("/proc/vmstat").read()
    for line in vmstat.splitlines()[:40]:
        key, _, value = line.partition(" ")
        assert kernel_oom.counter(vmstat, key) == int(value), line
