"""A notebook whose CUDA runtime was asked for the device count (``torch.cuda.is_available()``)
poisons fork while ``torch.cuda.is_initialized()`` stays False: the launch is refused before
any rank starts, naming the line, and our own GPU count never poisons it. No GPU exists here:
``fake_cuda_build_standin`` fakes a CUDA build's poisoning (see its docstring)."""
from __future__ import annotations

import os
import textwrap

import pytest
import torch

from helpers.fake_cuda_build_standin import fake_gpus_tracked, install_fake_cuda_build
from helpers.cuda_tracking_reset import reset_cuda_tracking
from notebook_launch import GuardError, LaunchError, notebook_launcher
from notebook_launch.planning import preflight
from notebook_launch.notebook import cuda_tracking
from notebook_launch.detect.platform import cuda_device_count
from notebook_launch.rank import runner
from helpers.processes import children

NVML = cuda_tracking.NVML_CHECK_VARIABLE


def noop():
    return "ran"


def assert_nothing_started():
    assert children() == []


@pytest.fixture
def fake_cuda_build(monkeypatch):
    """A FAKE CUDA build of torch whose runtime count poisons fork, on a machine with no GPU
    (as Colab's and Kaggle's CPU runtimes: a CUDA build of torch, no device)."""
    monkeypatch.delenv(NVML, raising=False)
    fake = install_fake_cuda_build(monkeypatch)
    reset_cuda_tracking()
    cuda_tracking.install()   # wraps the fake's runtime count, as it wraps torch's
    yield fake
    reset_cuda_tracking()


@pytest.fixture
def fake_cuda_build_with_two_fake_gpus(monkeypatch):
    """The same FAKE CUDA build, seeing two FAKE GPUs (NVML and the runtime count 2), so a launch
    plans CUDA ranks: only refusals are tested with it (no rank could use a fake GPU)."""
    with fake_gpus_tracked(monkeypatch) as fake:
        yield fake


def check_cuda_in_a_notebook_cell():
    return "cuda" if torch.cuda.is_available() else "cpu"   # the most common line of a notebook


def test_is_available_in_the_notebook_is_refused_and_located(fake_cuda_build_with_two_fake_gpus):
    assert check_cuda_in_a_notebook_cell() == "cuda"
    assert fake_cuda_build_with_two_fake_gpus.poisoned and not torch.cuda.is_initialized()
    with pytest.raises(GuardError) as info:   # asked for fork (unset, the ranks would start from the start process)
        notebook_launcher(noop, num_processes=2, start_method="fork")
    message = str(info.value)
    assert message.startswith("The CUDA runtime was already used in this notebook")
    assert "Cannot re-initialize CUDA in forked subprocess" in message
    assert "first asked for the device count at:" in message
    assert "check_cuda_in_a_notebook_cell" in message and "torch.cuda.is_available()" in message
    assert "start_method='spawn'" in message and "start_ranks(..., start_method='spawn')" in message
    assert "%ranks start --spawn" in message
    assert "PYTORCH_NVML_BASED_CUDA_CHECK" in message
    assert_nothing_started()
    assert NVML not in os.environ   # a refused launch sets nothing


def test_start_ranks_is_refused_too(fake_cuda_build_with_two_fake_gpus):
    from notebook_launch import start_ranks
    check_cuda_in_a_notebook_cell()
    with pytest.raises(GuardError, match="The CUDA runtime was already used"):
        start_ranks(2, ui="none", start_method="fork")
    assert_nothing_started()


def test_without_a_known_location_it_still_says_what_to_do(fake_cuda_build_with_two_fake_gpus):
    # the runtime asked past the witness (which wraps torch's function: functools.wraps sets __wrapped__)
    torch._C._cuda_getDeviceCount.__wrapped__()  # type: ignore[attr-defined]
    with pytest.raises(GuardError) as info:
        notebook_launcher(noop, num_processes=1, start_method="fork")
    assert "first asked" not in str(info.value)
    assert "start_method='spawn'" in str(info.value)


def test_spawn_launches_from_a_poisoned_notebook(fake_cuda_build):
    check_cuda_in_a_notebook_cell()
    assert notebook_launcher(noop, num_processes=2, start_method="spawn", ui="none") == ["ran", "ran"]


def test_without_a_gpu_a_poisoned_notebook_still_forks_and_its_environment_stays(fake_cuda_build):
    """Colab's and Kaggle's CPU runtimes: a CUDA build of torch and no GPU. Every notebook there
    asks is_available() (False); its CPU ranks never initialize CUDA, so the poisoned fork is
    harmless and the launch goes on, setting nothing in the notebook's environment."""
    assert check_cuda_in_a_notebook_cell() == "cpu"
    assert fake_cuda_build.poisoned and cuda_tracking.fork_is_poisoned()
    assert notebook_launcher(noop, num_processes=2, ui="none") == ["ran", "ran"]
    assert NVML not in os.environ


def test_our_gpu_count_leaves_fork_usable(fake_cuda_build):
    assert cuda_device_count() == 0   # NVML cannot answer: the runtime was asked in a throwaway child
    assert not fake_cuda_build.poisoned and not cuda_tracking.fork_is_poisoned()
    assert notebook_launcher(noop, num_processes=2, ui="none") == ["ran", "ran"]


def test_a_clean_notebook_with_gpus_gets_the_nvml_check_once_the_guard_passed(fake_cuda_build_with_two_fake_gpus):
    """The guard of a fork launch that plans CUDA ranks (no rank is started: the GPUs are fakes)."""
    assert cuda_device_count() == 2 and not cuda_tracking.fork_is_poisoned()
    assert NVML not in os.environ   # importing and counting set nothing
    preflight.check_cuda_not_initialized("fork", 2)
    assert os.environ[NVML] == "1"


def test_a_value_the_user_chose_for_the_nvml_check_is_kept(fake_cuda_build_with_two_fake_gpus, monkeypatch):
    monkeypatch.setenv(NVML, "0")
    preflight.check_cuda_not_initialized("fork", 2)
    assert os.environ[NVML] == "0"


def test_with_the_nvml_check_is_available_keeps_the_notebook_launchable(monkeypatch):
    """What the variable buys: is_available() asks NVML (a FAKE NVML that sees no GPU here)."""
    monkeypatch.setenv(NVML, "1")
    fake = install_fake_cuda_build(monkeypatch, nvml_gpus=0)
    cuda_tracking.install()
    assert torch.cuda.is_available() is False
    assert not fake.poisoned and not cuda_tracking.fork_is_poisoned()
    assert notebook_launcher(noop, num_processes=1, ui="none") == ["ran"]


def test_nothing_is_set_or_forked_on_a_cpu_build(monkeypatch):
    monkeypatch.delenv(NVML, raising=False)
    assert not cuda_tracking.cuda_build(torch)
    assert cuda_tracking.fork_is_poisoned() is False
    assert notebook_launcher(noop, num_processes=1, ui="none") == ["ran"]
    assert NVML not in os.environ


# --- the rank's own set-up: a launcher error with advice, never an unexplained exit ---------

def fake_set_device_in_a_poisoned_fork(spec):
    """What torch.cuda.set_device raises in a rank forked from a poisoned notebook (a FAKE: no GPU)."""
    raise RuntimeError("Cannot re-initialize CUDA in forked subprocess. To use CUDA with "
                       "multiprocessing, you must use the 'spawn' start method")


def test_a_rank_whose_setup_fails_reports_a_launcher_error_with_advice(monkeypatch):
    monkeypatch.setattr(runner, "rank_hooks", [*runner.rank_hooks, fake_set_device_in_a_poisoned_fork])
    with pytest.raises(LaunchError) as info:
        notebook_launcher(noop, num_processes=2, ui="none")
    message = str(info.value)
    assert "notebook_launch could not prepare rank" in message and "before calling your function" in message
    assert "fake_set_device_in_a_poisoned_fork raised RuntimeError" in message
    assert "start_method='spawn'" in message and "PYTORCH_NVML_BASED_CUDA_CHECK" in message
    assert "without raising a Python exception" not in message
    assert info.value.exc_type == "RuntimeError" and info.value.kind == "exception"


def broken_hook(spec):
    raise KeyError("something of ours")


def test_any_setup_failure_names_the_step_and_says_it_is_ours(monkeypatch):
    monkeypatch.setattr(runner, "rank_hooks", [*runner.rank_hooks, broken_hook])
    with pytest.raises(LaunchError) as info:
        notebook_launcher(noop, num_processes=1, ui="none")
    message = str(info.value)
    assert "the rank hook broken_hook raised KeyError" in message
    assert "This is a notebook_launch failure, not your function's" in message


# --- the pieces ---------------------------------------------------------------------------

class FakeCudaDriverStandIn:
    """A FAKE libcuda: cuDeviceGetCount answers ``code`` (3: CUDA_ERROR_NOT_INITIALIZED)."""

    def __init__(self, code):
        self.code = code
        self.loaded = []

    def __call__(self, path):
        self.loaded.append(path)
        return self

    def cuDeviceGetCount(self, pointer):
        return self.code


@pytest.mark.parametrize("mapped, code, initialized", [
    (False, 0, False),   # libcuda never loaded: nobody can have called cuInit (and we load nothing)
    (True, 3, False),    # loaded, cuInit not called
    (True, 0, True),     # cuInit ran: a forked child's CUDA is unusable
])
def test_the_driver_says_whether_cuinit_ran(tmp_path, mapped, code, initialized):
    maps = tmp_path / "maps"
    lines = ["7f00-7f01 r-xp 00000000 08:01 1 /usr/lib/libc.so.6"]
    if mapped:
        lines.append("7f02-7f03 r-xp 00000000 08:01 2 /usr/lib/x86_64-linux-gnu/libcuda.so.550.54")
    maps.write_text("\n".join(lines) + "\n")
    driver = FakeCudaDriverStandIn(code)
    assert cuda_tracking.cuda_driver_initialized(str(maps), load=driver) is initialized
    assert driver.loaded == (["/usr/lib/x86_64-linux-gnu/libcuda.so.550.54"] if mapped else [])


def test_this_process_has_no_cuda_driver():
    assert cuda_tracking.cuda_driver_initialized() is False


def test_a_throwaway_child_answers_and_is_reaped():
    assert cuda_tracking.in_throwaway_child(lambda: 7) == 7
    assert cuda_tracking.in_throwaway_child(lambda: 1 // 0) is None
    assert_nothing_started()


def test_the_cell_that_asked_is_named_in_a_kernel(tmp_path):
    pytest.importorskip("ipykernel")
    from helpers.nbutil import cell_text, make_notebook, run_notebook
    tests = os.path.dirname(os.path.abspath(__file__))
    nb = make_notebook(textwrap.dedent(f"""
        import sys; sys.path.insert(0, {tests!r})
        import torch
        from helpers.fake_cuda_build_standin import install_in_kernel
        install_in_kernel(gpus=2)   # a FAKE CUDA build with two FAKE GPUs: the launch plans CUDA ranks
        %load_ext notebook_launch
        from notebook_launch import notebook_launcher, GuardError
        """), """
        device = "cuda" if torch.cuda.is_available() else "cpu"
        """, """
        try:
            notebook_launcher(lambda: 1, num_processes=1, start_method="fork")   # asked for fork: refused
        except GuardError as err:
            print("GUARD:", err)
        else:
            print("LAUNCHED")
        """)
    executed = run_notebook(nb, cwd=str(tmp_path), timeout=300)
    text = "\n".join(cell_text(c) for c in executed.cells)
    assert "GUARD: The CUDA runtime was already used in this notebook" in text, text
    assert "device count after running cell [2]" in text, text
    assert 'device = "cuda" if torch.cuda.is_available() else "cpu"' in text, text
