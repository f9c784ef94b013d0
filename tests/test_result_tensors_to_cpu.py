"""Every tensor that leaves a rank is a CPU tensor, wherever it sits: in containers, modules,
dataclasses, state dicts, nested; parameters stay parameters with their requires_grad.

No XLA device exists in this venv (the torch_xla lane tests real XLA tensors): the FAKE
XLA tensors below are CPU tensors that say they live on ``xla:0``. torch pickles such a
tensor as a rebuild onto ``xla:0`` (``Tensor._reduce_ex_internal``), which cannot load here,
so these tests fail unless the rank's pickling moved them to the CPU."""
from __future__ import annotations

import os
import pickle
from dataclasses import dataclass, field

import torch

from notebook_launch.wire import shared_tensors
from notebook_launch.rank.runner import serialize_result


class FakeXlaTensorStandIn(torch.Tensor):
    """A FAKE XLA tensor: CPU data, but ``device`` says xla:0."""
    # results are plain tensors: torch's documented recipe, which its stubs (a classmethod there) do not take
    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]

    # torch's stubs declare Tensor.device a plain attribute; at runtime it is a read-only property too
    @property
    def device(self):  # type: ignore[override]
        return torch.device("xla", 0)


class FakeXlaParameterStandIn(torch.nn.Parameter):
    """A FAKE XLA parameter: CPU data, but ``device`` says xla:0."""

    @property
    def device(self):  # type: ignore[override]  # as FakeXlaTensorStandIn.device
        return torch.device("xla", 0)


def fake_xla(t: torch.Tensor) -> torch.Tensor:
    return torch.Tensor._make_subclass(FakeXlaTensorStandIn, t)


@dataclass
class Checkpoint:
    step: int
    weights: torch.Tensor
    extra: dict = field(default_factory=dict)


def round_trip(value):
    fd = shared_tensors.create_file()
    try:
        return shared_tensors.loads(serialize_result(value, fd), fd)
    finally:
        if fd is not None:
            os.close(fd)


def assert_plain_cpu(t, cls=torch.Tensor):
    assert type(t) is cls and t.device.type == "cpu"


def test_torch_would_rebuild_the_fake_on_xla():
    """The stand-in is faithful where it matters: torch's own pickling of it is a rebuild
    onto xla:0 (``_rebuild_device_tensor_from_cpu_tensor``), as for a real XLA tensor."""
    reduced = fake_xla(torch.ones(2)).__reduce_ex__(pickle.HIGHEST_PROTOCOL)
    assert "_rebuild_device_tensor_from_cpu_tensor" in repr(reduced) and "'xla:0'" in repr(reduced)


def test_a_module_with_xla_parameters_comes_back_on_the_cpu_with_its_parameters():
    model = torch.nn.Linear(3, 2)
    model.weight = FakeXlaParameterStandIn(model.weight.detach().clone())
    model.bias = FakeXlaParameterStandIn(model.bias.detach().clone(), requires_grad=False)
    model.register_buffer("running", fake_xla(torch.arange(3.0)))
    back = round_trip(model)
    assert_plain_cpu(back.weight, torch.nn.Parameter) and back.weight.requires_grad
    assert_plain_cpu(back.bias, torch.nn.Parameter) and not back.bias.requires_grad
    assert_plain_cpu(back.running) and back.running.tolist() == [0.0, 1.0, 2.0]
    assert torch.equal(back.weight, model.weight.detach().as_subclass(torch.Tensor))
    assert back(torch.ones(1, 3)).shape == (1, 2)   # a working CPU module


def test_a_dataclass_holding_xla_tensors_nested():
    value = [Checkpoint(3, fake_xla(torch.ones(2)), {"opt": {"m": fake_xla(torch.zeros(1))}})]
    [back] = round_trip(value)
    assert isinstance(back, Checkpoint) and back.step == 3
    assert_plain_cpu(back.weights) and back.weights.tolist() == [1.0, 1.0]
    assert_plain_cpu(back.extra["opt"]["m"])


def test_a_state_dict_and_tied_parameters():
    shared = FakeXlaParameterStandIn(torch.ones(4))
    back = round_trip({"state": {"a": fake_xla(torch.ones(2)), "b": shared}, "tied": [shared, shared]})
    assert_plain_cpu(back["state"]["a"])
    assert_plain_cpu(back["state"]["b"], torch.nn.Parameter)
    assert back["tied"][0] is back["tied"][1] is back["state"]["b"]   # one parameter, as in the rank


def test_requires_grad_is_kept_for_a_leaf_and_dropped_with_the_graph():
    leaf = fake_xla(torch.ones(2).requires_grad_())
    back = round_trip(Checkpoint(0, leaf))
    assert_plain_cpu(back.weights) and back.weights.requires_grad


def test_parameters_in_containers_stay_parameters_and_one_stays_one():
    """The rank pickles its value as it is (no container walk rebuilds it first): a parameter
    stays a parameter with its requires_grad, found twice it is one, on the CPU or off it."""
    p = torch.nn.Parameter(torch.ones(2))
    x = FakeXlaParameterStandIn(torch.ones(2))
    [q, q2, r, r2] = round_trip([p, p, x, x])
    assert_plain_cpu(q, torch.nn.Parameter) and q.requires_grad and q is q2
    assert_plain_cpu(r, torch.nn.Parameter) and r.requires_grad and r is r2


def test_cpu_tensors_are_not_copied_by_the_walk():
    t = torch.ones(3)
    assert not shared_tensors.rebuilds_off_cpu(torch, t)
    assert not shared_tensors.rebuilds_off_cpu(torch, torch.empty(2, device="meta"))
    assert shared_tensors.rebuilds_off_cpu(torch, fake_xla(t))


class FakeTpuDevice:
    """A FAKE TorchTPU device (``torch.device("tpu")`` exists only where torch_tpu renamed
    PrivateUse1 on a machine with TPU devices): what the rank's pickling reads of a device."""
    type = "tpu"
    index = 0


class FakeTpuTensorStandIn(torch.Tensor):
    """A FAKE TorchTPU tensor: CPU data with a storage, but ``device`` says tpu."""
    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]

    @property
    def device(self):  # type: ignore[override]  # as FakeXlaTensorStandIn.device
        return FakeTpuDevice()


def test_torch_tpu_tensors_are_copied_even_with_a_storage():
    """A TorchTPU tensor must never be unpickled as one in the notebook (its runtime would start there
    and hold the TPU devices the next launch's ranks need), storage or not."""
    t = torch.Tensor._make_subclass(FakeTpuTensorStandIn, torch.arange(3.0))
    assert shared_tensors.rebuilds_off_cpu(torch, t)
    [back] = round_trip([t])
    assert_plain_cpu(back) and back.tolist() == [0.0, 1.0, 2.0]
