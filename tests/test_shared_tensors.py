"""Tensors in results (and spawn arguments) travel through a memfd: values, dtypes,
sharing and layouts come back intact, and nothing is left behind (no /dev/shm file,
no fd or mapping in the notebook) after success, a rank's exception, or a rank
killed in the middle of writing its result."""
from __future__ import annotations

import collections
import dataclasses
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import pytest
from helpers.fd_helpers import fd_links
import torch

from notebook_launch import LaunchError, notebook_launcher
from notebook_launch.wire import shared_tensors

BIG = 1 << 18   # elements: 1 MiB of float32, above the inline limit


@dataclasses.dataclass
class Checkpoint:
    step: int
    weights: torch.Tensor
    extras: list


def sample_value(rank: int = 0) -> dict:
    """Tensors of several dtypes, layouts and sizes, nested in what users return."""
    torch.manual_seed(rank)   # the model's initial weights
    base = torch.arange(BIG, dtype=torch.float32).reshape(512, 512) + rank
    model = torch.nn.Sequential(torch.nn.Linear(300, 300), torch.nn.ReLU(), torch.nn.Linear(300, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # quantized tensors are deprecated in torch 2.13
        quantized = torch.quantize_per_tensor(torch.linspace(-1, 1, BIG), 0.01, 0, torch.qint8)
    state = collections.OrderedDict(
        fp32=base, bf16=base.to(torch.bfloat16), fp16=base.half(), int64=torch.arange(BIG) * (rank + 1),
        flags=base > 100, complex=torch.complex(base, -base), small=torch.tensor([rank, 7.0]),
        transposed=base.t(), strided=base[::3, 1::2], same=base, empty=torch.empty(0, 5),
        scalar=torch.tensor(3.5))
    return {"state": state, "model": model, "tuple": (base[7], [base[:2]]),
            "checkpoint": Checkpoint(step=rank, weights=base[1], extras=["text", 1]),
            "sparse": base[:8, :8].to_sparse(), "quantized": quantized,
            "parameter": torch.nn.Parameter(base[0].clone())}


def assert_same_tensor(got: torch.Tensor, want: torch.Tensor, name: str) -> None:
    assert type(got) is type(want), name
    assert got.dtype == want.dtype and got.shape == want.shape, name
    if want.is_sparse:
        assert torch.equal(got.to_dense(), want.to_dense()), name
    elif want.is_quantized:
        assert torch.equal(got.int_repr(), want.int_repr()) and got.q_scale() == want.q_scale(), name
    else:
        assert got.stride() == want.stride() and got.storage_offset() == want.storage_offset(), name
        assert torch.equal(got, want), name


def assert_same_value(got: dict, want: dict) -> None:
    for key, tensor in want["state"].items():
        assert_same_tensor(got["state"][key], tensor, key)
    assert isinstance(got["state"], collections.OrderedDict)
    for (name, got_p), (_, want_p) in zip(got["model"].state_dict().items(), want["model"].state_dict().items()):
        assert_same_tensor(got_p, want_p, name)
    assert isinstance(got["model"][0], torch.nn.Linear)
    assert_same_tensor(got["tuple"][0], want["tuple"][0], "tuple")
    assert_same_tensor(got["tuple"][1][0], want["tuple"][1][0], "nested list")
    assert isinstance(got["checkpoint"], Checkpoint) and got["checkpoint"].extras == ["text", 1]
    assert_same_tensor(got["checkpoint"].weights, want["checkpoint"].weights, "dataclass")
    for key in ("sparse", "quantized"):
        assert_same_tensor(got[key], want[key], key)
    # A module keeps its Parameters; a bare Parameter in a result comes back detached.
    assert isinstance(got["model"][0].weight, torch.nn.Parameter)
    assert_same_tensor(got["parameter"].data, want["parameter"].data, "parameter")


def assert_storages_still_shared(got: dict) -> None:
    """Views of one storage come back as views of one storage: a write shows in all."""
    state = got["state"]
    ptr = state["fp32"].untyped_storage().data_ptr()
    for key in ("transposed", "strided", "same"):
        assert state[key].untyped_storage().data_ptr() == ptr, key
    assert got["checkpoint"].weights.untyped_storage().data_ptr() == ptr
    state["fp32"][0, 1] = -42.0
    assert state["transposed"][1, 0] == -42.0 and state["same"][0, 1] == -42.0


def tensor_file_mappings() -> list:
    with open("/proc/self/maps") as f:
        return [line for line in f if "notebook_launch-tensors" in line]


class NothingLeftBehind:
    """Before/after view of what a launch could leave: /dev/shm entries, fds, memfd mappings."""

    def __init__(self) -> None:
        self.shm = set(os.listdir("/dev/shm"))
        self.fds = fd_links()

    def check(self) -> None:
        import gc
        gc.collect()
        new_shm = set(os.listdir("/dev/shm")) - self.shm
        ours = [name for name in new_shm if "notebook_launch" in name or name.startswith(f"torch_{os.getpid()}_")]
        assert not ours, f"left in /dev/shm: {ours}"
        now = fd_links()
        from notebook_launch.engines.local.start_process import held_fds
        from notebook_launch.process.leftovers import keeper_fds
        kept = {str(fd) for fd in keeper_fds() | held_fds()}   # the keeper's, the start process's: kept for good
        new_fds = {fd: link for fd, link in now.items() if self.fds.get(fd) != link and fd not in kept}
        assert not new_fds, f"fds left open in the notebook: {new_fds}"
        assert not tensor_file_mappings(), "a tensor file is still mapped with no tensor alive"


# --- the transport itself, in one process ----------------------------------------------

def tensor_file() -> int:
    """A memfd for tensor bytes, for the tests that need one (this suite runs on Linux, where memfds exist)."""
    fd = shared_tensors.create_file()
    assert fd is not None, "memfd_create is not available here"
    return fd


@pytest.mark.parametrize("with_file", [True, False], ids=["memfd", "inline"])
def test_values_come_back_equal_and_shared(with_file):
    fd = shared_tensors.create_file() if with_file else None
    want = sample_value()
    try:
        data = shared_tensors.dumps(want, fd)
        got = shared_tensors.loads(data, fd)
    finally:
        if fd is not None:
            os.close(fd)
    if with_file:
        assert len(data) < BIG, "big tensors' bytes went to the file, not the pickle stream"
    assert_same_value(got, want)
    assert_storages_still_shared(got)


def test_loaded_tensors_are_private_copies_on_write():
    fd = tensor_file()
    try:
        data = shared_tensors.dumps({"t": torch.ones(BIG)}, fd)
        first, second = shared_tensors.loads(data, fd), shared_tensors.loads(data, fd)
    finally:
        os.close(fd)
    first["t"].add_(1)
    assert float(second["t"].sum()) == BIG, "a write into one loaded copy must not reach another"


def test_tensor_files_are_unmapped_when_the_tensors_go():
    import gc
    gc.collect()
    before = len(tensor_file_mappings())
    fd = tensor_file()
    try:
        got = shared_tensors.loads(shared_tensors.dumps([torch.ones(BIG), torch.zeros(BIG)], fd), fd)
    finally:
        os.close(fd)
    assert len(tensor_file_mappings()) == before + 2
    del got
    assert len(tensor_file_mappings()) == before, "unmapped as soon as the last tensor goes"


def test_plain_pickle_cannot_load_it_and_says_so():
    fd = tensor_file()
    try:
        data = shared_tensors.dumps(torch.ones(BIG), fd)
    finally:
        os.close(fd)
    with pytest.raises(pickle.UnpicklingError, match="shared_tensors.loads"):
        pickle.loads(data)


def test_objects_without_tensors_pickle_as_before():
    import cloudpickle
    value = {"numbers": list(range(1000)), "function": lambda x: x + 1}
    got = shared_tensors.loads(shared_tensors.dumps(value, None), None)
    assert got["numbers"] == value["numbers"] and got["function"](1) == 2
    assert cloudpickle.loads(cloudpickle.dumps(value))["numbers"] == got["numbers"]


class Marker:
    pass


def test_a_runner_pickler_with_its_own_reducer_override_keeps_working():
    """The runner may pickle with its own cloudpickle subclass (e.g. notebook classes by
    reference): tensors still go to the file, and its reducer_override still runs."""
    import cloudpickle

    class RunnerPickler(cloudpickle.Pickler):
        def reducer_override(self, obj):
            if isinstance(obj, Marker):
                return str, ("handled by the runner's pickler",)
            return super().reducer_override(obj)

    fd = tensor_file()
    try:
        data = shared_tensors.dumps({"m": Marker(), "t": torch.ones(BIG), "f": lambda: 3}, fd, RunnerPickler)
        got = shared_tensors.loads(data, fd)
    finally:
        os.close(fd)
    assert got["m"] == "handled by the runner's pickler" and got["f"]() == 3
    assert float(got["t"].sum()) == BIG and len(data) < BIG


def test_the_file_cannot_shrink_under_a_mapping():
    fd = tensor_file()
    try:
        shared_tensors.dumps(torch.ones(BIG), fd)
        with pytest.raises(PermissionError):
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)


# --- through real launches ---------------------------------------------------------------

def return_sample():
    return sample_value(int(os.environ["RANK"]))


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_results_with_nested_tensors_come_back_through_shared_memory(log_dir, start_method):
    clean = NothingLeftBehind()
    results = notebook_launcher(return_sample, num_processes=2, log_dir=log_dir, start_method=start_method)
    for rank, got in enumerate(results):
        assert_same_value(got, sample_value(rank))
        assert_storages_still_shared(got)
    assert tensor_file_mappings(), "big tensors map the rank's result file"
    del results, got
    clean.check()


def fail_on_rank_one():
    if os.environ["RANK"] == "1":
        raise ValueError("rank one fails")
    return torch.ones(BIG)


def test_nothing_left_after_a_rank_fails(log_dir):
    clean = NothingLeftBehind()
    with pytest.raises(LaunchError, match="rank one fails") as caught:
        notebook_launcher(fail_on_rank_one, num_processes=2, log_dir=log_dir)
    del caught
    clean.check()


class KillsItsRank:
    """Pickled after a big tensor: the rank dies by SIGKILL while writing its result."""

    def __reduce__(self):
        os.kill(os.getpid(), signal.SIGKILL)


def killed_mid_transfer():
    if os.environ["RANK"] == "1":
        return {"written first": torch.ones(4 * BIG), "then": KillsItsRank()}
    return torch.ones(BIG)


def test_nothing_left_after_a_rank_is_killed_mid_transfer(log_dir):
    clean = NothingLeftBehind()
    with pytest.raises(LaunchError, match="SIGKILL") as caught:
        notebook_launcher(killed_mid_transfer, num_processes=2, log_dir=log_dir)
    assert caught.value.rank == 1 and caught.value.kind == "signal"
    del caught
    clean.check()


NOTEBOOK_DIES = textwrap.dedent("""
    import os, sys, time, torch
    from notebook_launch import notebook_launcher

    class Waits:
        def __reduce__(self):   # the rank has written the tensor's bytes; hold it here
            with open(os.path.join(sys.argv[1], str(os.getpid())), "w"):
                pass
            time.sleep(120)

    def fn():
        return {"tensor": torch.ones(1 << 20), "then": Waits()}

    notebook_launcher(fn, num_processes=2, ui="none")
""")


def memfd_holders(pids) -> list:
    holders = []
    for pid in pids:
        try:
            for name in os.listdir(f"/proc/{pid}/fd"):
                if "notebook_launch-tensors" in os.readlink(f"/proc/{pid}/fd/{name}"):
                    holders.append(pid)
        except OSError:   # gone
            pass
    return holders


def test_nothing_left_when_the_notebook_dies_mid_transfer(tmp_path):
    shm_before = set(os.listdir("/dev/shm"))
    env = dict(os.environ, NOTEBOOK_LAUNCH_LOG_DIR=str(tmp_path / "runs"))
    writing = tmp_path / "writing"
    writing.mkdir()
    notebook = subprocess.Popen([sys.executable, "-c", NOTEBOOK_DIES, str(writing)], env=env,
                                stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while len(os.listdir(writing)) < 2:
            assert notebook.poll() is None, "the notebook process ended before its ranks wrote their results"
            assert time.monotonic() < deadline, "the ranks never started writing their results"
            time.sleep(0.05)
        ranks = [int(name) for name in os.listdir(writing)]
        assert memfd_holders([notebook.pid] + ranks), "mid-transfer, the result files are held"
    finally:
        notebook.kill()
        notebook.wait()
    deadline = time.monotonic() + 30
    while memfd_holders(ranks) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not memfd_holders(ranks), "ranks die with the notebook, and their result files with them"
    assert not [n for n in set(os.listdir("/dev/shm")) - shm_before if "notebook_launch" in n]


def sum_and_change(big):
    total = float(big.sum())
    big.add_(1)   # copy-on-write: neither the notebook nor the other rank sees this
    return {"sum": total, "after": float(big.sum()), "nbytes": big.untyped_storage().nbytes()}


def test_spawn_arguments_with_a_big_tensor_travel_once_through_shared_memory(log_dir):
    clean = NothingLeftBehind()
    big = torch.ones(16 * BIG)
    results = notebook_launcher(sum_and_change, args=(big,), num_processes=2, log_dir=log_dir,
                                start_method="spawn")
    for result in results:
        assert result == {"sum": 16.0 * BIG, "after": 32.0 * BIG, "nbytes": 64 * BIG}
    assert float(big.sum()) == 16 * BIG
    clean.check()
