"""Every tensor torch.save can store comes back from a rank as it was (issue 23 item 14).

Kept, for every tensor anywhere in a result (containers, modules, dataclasses): its class
(``nn.Parameter``, a ``torch.Tensor`` subclass), dtype (bool, every int and uint width,
float16/bfloat16/32/64, complex, every float8), layout (strided, sparse COO/CSR/CSC/BSR,
nested, quantized per tensor and per channel), shape, strides and storage offset (views,
transposes, expanded and zero-size tensors, channels_last), ``requires_grad``, and its values;
the device becomes the CPU. Tensors that shared a storage share one. Not kept: autograd history
(a tensor comes back as a leaf), and storage sharing with the rank (the pages are the
notebook's copy-on-write). Named tensors: this torch has none to test.

What cannot come back is named by its path inside the result; and when a process cannot map
one more tensor (vm.max_map_count), the bytes are read instead of mapped.
"""
from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import threading

import pytest
import torch

from notebook_launch import LaunchError, notebook_launcher
from notebook_launch.planning.net import free_port

BIG = 1 << 15   # elements: above shared_tensors.INLINE_LIMIT for most dtypes, so the memfd path


class Tagged(torch.Tensor):
    """A tensor subclass defined in a module both sides import."""


def all_kinds() -> dict:
    torch.manual_seed(0)
    kinds: dict = {}
    for dtype in (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16,
                  torch.uint32, torch.uint64, torch.float16, torch.bfloat16, torch.float32, torch.float64,
                  torch.complex64, torch.complex128, torch.float8_e4m3fn, torch.float8_e5m2,
                  torch.float8_e4m3fnuz, torch.float8_e5m2fnuz):
        kinds[f"dtype {dtype}"] = (torch.arange(BIG) % 7).to(dtype)
        kinds[f"small {dtype}"] = (torch.arange(5) % 2).to(dtype)   # inline in the pickle stream
    base = torch.randn(256, 256)
    kinds.update({
        "parameter": torch.nn.Parameter(torch.randn(BIG)),
        "frozen parameter": torch.nn.Parameter(torch.randn(BIG), requires_grad=False),
        "requires_grad leaf": torch.randn(BIG, requires_grad=True),
        "view": base[10:20],
        "same base": base,
        "transposed": base.t(),
        "strided": torch.randn(BIG)[::3],
        "expanded": torch.randn(1, 300).expand(300, 300),
        "zero-size": torch.empty(0, 5),
        "scalar": torch.tensor(3.5),
        "channels_last": torch.randn(2, 3, 64, 64).to(memory_format=torch.channels_last),
        "conj": torch.randn(BIG, dtype=torch.complex64).conj(),
        "sparse coo": torch.randn(300, 300).relu().to_sparse(),
        "sparse csr": torch.randn(300, 300).relu().to_sparse_csr(),
        "sparse csc": torch.randn(300, 300).relu().to_sparse_csc(),
        "sparse bsr": torch.randn(300, 300).relu().to_sparse_bsr((3, 3)),
        "quantized": torch.quantize_per_tensor(torch.randn(BIG), 0.1, 10, torch.quint8),
        "quantized per channel": torch.quantize_per_channel(torch.randn(64, 512), torch.rand(64) + 0.1,
                                                            torch.zeros(64, dtype=torch.long), 0, torch.qint8),
        "nested": torch.nested.nested_tensor([torch.randn(300, 5), torch.randn(400, 5)]),
        "subclass": torch.randn(BIG).as_subclass(Tagged),
        "module": torch.nn.BatchNorm1d(4),
    })
    return kinds


def dense(t: torch.Tensor) -> torch.Tensor:
    if t.is_quantized:
        return t.dequantize()
    if t.is_nested:
        return torch.cat([part.flatten() for part in t.unbind()])
    if t.layout != torch.strided:
        return t.to_dense()
    return t.resolve_conj()


def assert_same(name: str, got, want) -> None:
    if isinstance(want, torch.nn.Module):
        assert type(got) is type(want), name
        for (key, a), (_, b) in zip(got.state_dict().items(), want.state_dict().items()):
            assert_same(f"{name}.{key}", a, b)
        return
    assert type(got) is type(want), (name, type(got))
    assert got.dtype == want.dtype and got.layout == want.layout, name
    assert got.requires_grad == want.requires_grad, name
    assert got.device.type == "cpu", name
    if not want.is_nested:
        assert got.shape == want.shape, name
    if want.layout == torch.strided and not want.is_nested:
        assert got.stride() == want.stride() and got.storage_offset() == want.storage_offset(), name
    assert torch.equal(dense(got.detach()), dense(want.detach())), name


def returns_all_kinds():
    return all_kinds()


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_every_kind_of_tensor_comes_back(start_method, tmp_path):
    [got] = notebook_launcher(returns_all_kinds, num_processes=1, start_method=start_method,
                              use_port=str(free_port()), log_dir=str(tmp_path / "logs"), ui="none", timeout=240)
    want = all_kinds()
    assert set(got) == set(want)
    for name in want:
        assert_same(name, got[name], want[name])
    # what shared a storage in the rank shares one here
    assert got["view"].untyped_storage().data_ptr() == got["same base"].untyped_storage().data_ptr()
    assert got["transposed"].untyped_storage().data_ptr() == got["same base"].untyped_storage().data_ptr()
    del got   # and once they are gone, so are their pages (torch's sparse rebuild used to keep them)
    gc.collect()
    with open("/proc/self/maps") as f:
        assert not [line for line in f if "notebook_launch-tensors" in line]


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(2, 2) for _ in range(3)])
        # what a callback or logger leaves on a module (torch's stubs take only tensors and modules here)
        self.layers[2].lock = threading.Lock()  # type: ignore[assignment]


def returns_a_model_with_a_lock():
    return {"model": Net(), "step": 3}


def test_what_cannot_come_back_is_named_by_its_path(tmp_path):
    with pytest.raises(LaunchError) as caught:
        notebook_launcher(returns_a_model_with_a_lock, num_processes=1, use_port=str(free_port()),
                          log_dir=str(tmp_path / "logs"), ui="none", timeout=240)
    message = str(caught.value)
    assert "result['model'].layers[2].lock (_thread.lock)" in message, message
    assert caught.value.kind == "result"


MANY_TENSORS = textwrap.dedent('''
    import torch
    from notebook_launch.wire import shared_tensors
    tensors = [torch.full((1 << 14,), float(i)) for i in range(3000)]   # 64 KiB each: all through the memfd
    fd = shared_tensors.create_file()
    data = shared_tensors.dumps(tensors, fd)
    before = sum(1 for _ in open("/proc/self/maps"))
    back = shared_tensors.loads(data, fd)
    added = sum(1 for _ in open("/proc/self/maps")) - before
    assert all(torch.equal(a, b) for a, b in zip(back, tensors)) and len(back) == 3000
    back[2999][0] = -1.0                      # copy-on-write pages, as for a mapping of its own
    assert float(back[2998][0]) == 2998.0 and float(tensors[2999][0]) == 2999.0
    print(added)
''')


def test_very_many_tensors_take_few_mappings():
    """Each mapping counts against vm.max_map_count (65530 by default): a result of thousands of
    tensors maps each of the first MAPPINGS_PER_LOAD on its own and the rest of the file once."""
    from notebook_launch.wire.shared_tensors import MAPPINGS_PER_LOAD
    done = subprocess.run([sys.executable, "-c", MANY_TENSORS], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert int(done.stdout.split()[-1]) <= MAPPINGS_PER_LOAD + 8


OUT_OF_MAPPINGS = textwrap.dedent('''
    import ctypes, mmap, sys, torch
    from notebook_launch.wire import shared_tensors
    tensors = [torch.full((1 << 16,), float(i)) for i in range(40)]   # 256 KiB each: memfd path
    fd = shared_tensors.create_file()
    data = shared_tensors.dumps(tensors, fd)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int64]
    limit = int(open("/proc/sys/vm/max_map_count").read())
    used = sum(1 for _ in open("/proc/self/maps"))
    protections = (mmap.PROT_READ, 0)   # PROT_READ, PROT_NONE: neighbours that differ never merge
    for i in range(limit - used + 10):
        address = libc.mmap(None, mmap.PAGESIZE, protections[i % 2], mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
        if address in (None, ctypes.c_void_p(-1).value):
            break
    else:
        sys.exit("never ran out of mappings")
    try:
        back = shared_tensors.loads(data, fd)
    except OSError as exc:
        print("ERROR", exc)
    else:
        assert all(torch.equal(a, b) for a, b in zip(back, tensors))
        print("OK", len(back))
''')


def test_out_of_mappings_the_tensors_are_read_or_the_limit_is_named():
    """With vm.max_map_count reached, a result either still loads (its bytes read into memory,
    where malloc can still grow the heap) or fails saying which limit and how to raise it."""
    done = subprocess.run([sys.executable, "-c", OUT_OF_MAPPINGS], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    outcome = done.stdout.strip()
    if outcome.startswith("ERROR"):
        assert "vm.max_map_count" in outcome and "sysctl -w vm.max_map_count=" in outcome, outcome
    else:
        assert outcome == "OK 40", outcome
