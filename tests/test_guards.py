"""Guards refuse before any process starts, and say what to do."""
import inspect
import os
import socket

import pytest
import torch

from notebook_launch import GuardError, LaunchArgumentError, LaunchError, notebook_launcher
from notebook_launch.notebook import cuda_tracking
from helpers.cuda_tracking_reset import reset_cuda_tracking
from notebook_launch.planning.net import free_port
from notebook_launch.planning.options import _DefaultPort   # the default use_port's marker (a busy one is replaced)
from helpers.processes import children


def noop():
    return "ran"


def assert_nothing_started():
    assert children() == []


@pytest.fixture
def clean_accelerate_state():
    from accelerate.state import AcceleratorState
    AcceleratorState._reset_state(True)
    yield
    AcceleratorState._reset_state(True)


@pytest.mark.parametrize("make", ["PartialState", "AcceleratorState", "Accelerator"])
def test_existing_accelerate_state_is_refused(make, clean_accelerate_state, monkeypatch):
    import accelerate
    from accelerate.state import AcceleratorState, PartialState
    monkeypatch.setenv("ACCELERATE_USE_CPU", "true")
    if make == "PartialState":
        PartialState()
    elif make == "AcceleratorState":
        from accelerate.utils import TorchDynamoPlugin
        AcceleratorState(_from_accelerator=True, dynamo_plugin=TorchDynamoPlugin())
    else:
        accelerate.Accelerator()
    with pytest.raises(GuardError) as info:
        notebook_launcher(noop, num_processes=2)
    message = str(info.value)
    assert "already holds" in message
    assert ("PartialState" if make == "PartialState" else "Accelerator") in message
    assert "inside the function" in message and "restart the kernel" in message
    assert_nothing_started()


def test_after_reset_the_launch_works(clean_accelerate_state):
    from accelerate.state import AcceleratorState, PartialState
    PartialState()
    AcceleratorState._reset_state(True)
    assert notebook_launcher(noop, num_processes=1) == ["ran"]


@pytest.fixture
def fake_cuda_initialized(monkeypatch):
    """Stands in for a CUDA context in the parent: no GPU exists on the test machine."""
    monkeypatch.setattr(cuda_tracking, "is_cuda_initialized", lambda: True)
    reset_cuda_tracking()
    yield
    reset_cuda_tracking()


def touch_cuda_in_a_notebook_cell():
    try:
        torch.cuda._lazy_init()  # the wrapper records this stack, then the CPU build raises
    except (AssertionError, RuntimeError):
        pass


def test_cuda_initialized_in_parent_is_refused_and_located(fake_cuda_initialized):
    cuda_tracking.install()
    touch_cuda_in_a_notebook_cell()
    with pytest.raises(GuardError) as info:   # asked for fork: refused (unset, ranks start from the start process)
        notebook_launcher(noop, num_processes=2, start_method="fork")
    message = str(info.value)
    assert message.startswith("CUDA is already initialized in this notebook")
    assert "CUDA was first initialized at:" in message
    assert "touch_cuda_in_a_notebook_cell" in message
    assert "start_method='spawn'" in message and "restart the kernel" in message
    assert_nothing_started()


def test_cuda_guard_without_known_location_still_says_what_to_do(fake_cuda_initialized):
    """CUDA initialized before the hooks were installed (import notebook_launch installs nothing;
    the first launch does): the guard still refuses, says the line is unknown and why, and how
    to have it named next time."""
    with pytest.raises(GuardError) as info:
        notebook_launcher(noop, start_method="fork")
    message = str(info.value)
    assert "restart the kernel" in message
    assert "Where CUDA was initialized is unknown: it happened before notebook_launch began recording" in message
    assert "%load_ext notebook_launch" in message and "install_hooks()" in message
    assert "CUDA was first initialized at:" not in message


def launch_again():
    return notebook_launcher(noop, num_processes=1)


def test_launch_from_inside_a_rank_is_refused():
    with pytest.raises(LaunchError) as info:
        notebook_launcher(launch_again, num_processes=1)
    assert "GuardError: notebook_launcher was called from inside a launched rank" in str(info.value)


@pytest.mark.parametrize("kwargs, names", [
    (dict(num_processes=0), ["num_processes", ">= 1"]),
    (dict(num_processes=-2), ["num_processes", ">= 1"]),
    (dict(num_processes="2"), ["num_processes", "whole number"]),
    (dict(num_processes=2.0), ["num_processes", "whole number"]),
    (dict(mixed_precision="fp32"), ["mixed_precision='fp32'", "no, fp16, bf16, fp8"]),
    (dict(args=5), ["args must be a tuple or list", "args=(value,)"]),
    (dict(kwargs=[1]), ["kwargs must be a dict"]),
    (dict(timeout=0), ["timeout", "> 0"]),
    (dict(timeout="10"), ["timeout", "> 0"]),
    (dict(start_method="thread"), ["start_method='thread'", "'fork'", "'spawn'"]),
    (dict(ui="gui"), ["ui='gui'", "'widget'", "'text'"]),
    (dict(num_nodes=0), ["num_nodes", ">= 1"]),
    (dict(node_rank=1), ["node_rank", "between 0 and 0"]),
    (dict(use_port="http"), ["use_port", "between 1 and 65535"]),
    (dict(use_port=70000), ["use_port", "between 1 and 65535"]),
    (dict(rdzv_backend="zookeeper"), ["rdzv_backend='zookeeper'", "'static'", "'c10d'"]),
    (dict(monitor_interval=0), ["monitor_interval", "> 0"]),
])
def test_invalid_arguments_name_the_argument_and_valid_values(kwargs, names):
    with pytest.raises(LaunchArgumentError) as info:
        notebook_launcher(noop, **kwargs)
    for name in names:
        assert name in str(info.value)
    assert_nothing_started()


def test_non_callable_function():
    with pytest.raises(LaunchArgumentError, match="function must be callable"):
        notebook_launcher(42)  # type: ignore[arg-type]  # on purpose: not callable


@pytest.fixture
def fake_two_cuda_gpus(monkeypatch):
    """Stands in for a machine with 2 GPUs (none exist here); only the count is faked."""
    from notebook_launch.detect import platform as environment
    monkeypatch.setattr(environment, "cuda_device_count", lambda: 2)


def test_more_processes_than_gpus(fake_two_cuda_gpus):
    with pytest.raises(LaunchArgumentError) as info:
        notebook_launcher(noop, num_processes=3)
    assert "num_processes=3 is more than the 2 CUDA GPU(s)" in str(info.value)
    assert "between 1 and 2" in str(info.value)


def listen(port):
    sock = socket.socket()
    sock.bind(("", port))
    sock.listen()
    return sock


def test_explicit_busy_port_is_an_error():
    port = free_port()
    with listen(port):
        with pytest.raises(LaunchArgumentError) as info:
            notebook_launcher(noop, num_processes=1, use_port=str(port))
    assert f"use_port={port} is already in use" in str(info.value)


def test_the_default_port_is_29500_and_may_be_replaced():
    """notebook_launcher's use_port default is 29500, marked as the default (``_DefaultPort``): a busy
    one is replaced, not an error (the test below holds a port of its own marked the same way)."""
    default = inspect.signature(inspect.unwrap(notebook_launcher)).parameters["use_port"].default
    assert isinstance(default, _DefaultPort) and default == "29500"


def test_busy_default_port_picks_a_free_one_and_says_so(capsys):
    """29500 itself may be held by anything on a shared machine: the test holds a port the kernel
    gave it, and passes it as the default is passed (so deterministic, never skipped)."""
    with listen(0) as held:
        port = str(held.getsockname()[1])
        results = notebook_launcher(lambda: os.environ["MASTER_PORT"], num_processes=2, use_port=_DefaultPort(port))
    out = capsys.readouterr().out
    assert results[0] == results[1] != port
    # who holds it, here the process itself (a TCPStore or process group made outside a launch does)
    assert f"port {port} is held by this process itself (pid {os.getpid()}); using port {results[0]} instead" in out
    # said before the line that uses the new port, not after it (issue 35)
    assert out.index(f"port {port} is held") < out.index(f", port {results[0]}, "), out
