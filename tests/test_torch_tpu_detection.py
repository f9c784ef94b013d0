"""TorchTPU (torch_tpu) detection, the launch decision and the guard, without torch_tpu and without a
TPU: each machine is a FAKE root (tests/helpers/fake_tpu_machine.py) and the installed version is a
parameter. The lane with the real torch_tpu 0.2.0 is tests/tpu/ (scripts/test-tpu-lane.sh)."""
from __future__ import annotations

import sys
import types

import pytest
from helpers.fake_tpu_machine import V3, V5E, V6E, V7, fake_tpu_root

from notebook_launch import GuardError, LaunchArgumentError
from notebook_launch.planning import preflight
from notebook_launch.engines.local.start_process import withhold_device_backends
from notebook_launch.detect import torch_tpu
from notebook_launch.detect.platform import Probe
from notebook_launch.wire.plan import build_plan
from notebook_launch.planning.target import launch_target

NO_PROBE = Probe(tpu_root=None)


def target(tmp_root, *, version="0.2.0", start_method=None, num_processes=None, **environ):
    return launch_target(start_method, num_processes, environ=environ, probe=NO_PROBE, root=tmp_root,
                         torch_tpu_version=version)


# --- detection -----------------------------------------------------------------------------
def test_a_v6e_4_vm_has_four_devices_torch_tpu_can_drive(tmp_path):
    info = torch_tpu.detect_torch_tpu(fake_tpu_root(tmp_path, V6E, 4), version="0.2.0")
    assert (info.installed, info.version, info.devices, info.chip_name) == (True, "0.2.0", 4, "TPU v6e")
    assert info.topologies[4] == "2,2,1" and info.can_launch
    assert "4 TPU v6e device(s) on PCI, each in /dev/vfio" in info.evidence


def test_devices_not_exposed_through_vfio_are_not_counted(tmp_path):
    """torch_tpu counts a PCI function only when its IOMMU group is a file in /dev/vfio."""
    info = torch_tpu.detect_torch_tpu(fake_tpu_root(tmp_path, V5E, 8, vfio=False), version="0.2.0")
    assert info.devices == 0 and not info.can_launch


def test_v3_chips_are_tpus_torch_tpu_does_not_drive(tmp_path):
    info = torch_tpu.detect_torch_tpu(fake_tpu_root(tmp_path, V3, 4, accel=4), version="0.2.0")
    assert info.devices == 0 and info.other_chips == (V3,) * 4
    assert "v2/v3" in info.describe()


def test_a_machine_without_chips_and_one_without_torch_tpu(tmp_path):
    nic = (("0x8086", "0x1533"),)
    assert torch_tpu.detect_torch_tpu(fake_tpu_root(tmp_path, other_pci=nic), version="0.2.0").devices == 0
    info = torch_tpu.detect_torch_tpu(fake_tpu_root(tmp_path, V6E, 4), version=None)
    assert info.devices == 4 and not info.installed and not info.can_launch


def test_v7_counts_each_exposed_device(tmp_path):
    info = torch_tpu.detect_torch_tpu(fake_tpu_root(tmp_path, V7, 2), version="0.2.0")
    assert info.devices == 2 and info.topologies[2] == "1,1,1,2"


@pytest.mark.parametrize("version, kind, words", [
    ("0.2.0", "tpu", "torch_tpu 0.2.0 (TorchTPU); a launch runs TorchTPU ranks, one per device (4 TPU v6e)"),
    (None, "cpu", "none installed; a launch runs no TPU ranks"),
])
def test_env_names_the_stack_and_what_a_launch_does(tmp_path, version, kind, words):
    info = torch_tpu.detect_torch_tpu(fake_tpu_root(tmp_path, V6E, 4), version=version)
    assert torch_tpu.describe_stacks(info, None, kind) == words
    assert torch_tpu.describe_stacks(info, "2.9.0", "xla").endswith("a launch runs torch_xla's xmp.spawn")


# --- the launch decision ---------------------------------------------------------------------
def test_torch_tpu_with_devices_launches_one_spawned_rank_per_device(tmp_path):
    t = target(fake_tpu_root(tmp_path, V6E, 4))
    assert (t.device_kind, t.start_method, t.num_processes, t.dist_backend) == ("tpu", "spawn", 4, "tpu")
    assert "topology 2,2,1" in t.notes[0]
    assert target(fake_tpu_root(tmp_path, V6E, 4), start_method="spawn").device_kind == "tpu"


def test_a_sub_slice_torch_tpu_knows_and_one_it_does_not(tmp_path):
    root = fake_tpu_root(tmp_path, V5E, 8)
    assert target(root, num_processes=4).num_processes == 4
    with pytest.raises(LaunchArgumentError, match=r"num_processes=2 .* one of \[1, 4, 8\]"):
        target(root, num_processes=2)


def test_fork_and_xla_and_pjrt_device_keep_their_meaning(tmp_path):
    root = fake_tpu_root(tmp_path, V6E, 4)
    forked = target(root, start_method="fork")
    assert forked.device_kind == "cpu" and "cannot start TorchTPU ranks" in forked.notes[0]
    assert target(root, PJRT_DEVICE="CPU").device_kind != "tpu"
    assert target(root, version=None).device_kind == "cpu"
    assert target(root, NOTEBOOK_LAUNCH_DEVICE="cpu").device_kind == "cpu"


@pytest.mark.parametrize("machine, version, start_method, words", [
    ("cpu", "0.2.0", None, "no TPU device TorchTPU can use"),
    ("v3", "0.2.0", None, "v2 or v3, which TorchTPU does not drive"),
    ("v6e", None, None, "torch_tpu is not installed"),
    ("v6e", "0.2.0", "fork", "start_method='fork' cannot start TorchTPU ranks"),
    ("v6e", "0.2.0", "xla", "start_method='xla' cannot start TorchTPU ranks"),
])
def test_a_tpu_launch_asked_for_where_it_cannot_run_is_refused(tmp_path, machine, version, start_method, words):
    root = {"cpu": lambda: fake_tpu_root(tmp_path), "v3": lambda: fake_tpu_root(tmp_path, V3, 4, accel=4),
            "v6e": lambda: fake_tpu_root(tmp_path, V6E, 4)}[machine]()
    with pytest.raises(LaunchArgumentError, match="What to do|Use start_method") as err:
        target(root, version=version, start_method=start_method, NOTEBOOK_LAUNCH_DEVICE="tpu")
    assert words in str(err.value)


def test_a_bad_device_choice_is_refused(tmp_path):
    with pytest.raises(LaunchArgumentError, match="NOTEBOOK_LAUNCH_DEVICE='gpu'"):
        target(fake_tpu_root(tmp_path), NOTEBOOK_LAUNCH_DEVICE="gpu")


# --- the ranks' environment --------------------------------------------------------------------
def test_every_rank_has_the_same_torch_tpu_variables_and_its_own_local_rank(tmp_path):
    info = torch_tpu.detect_torch_tpu(fake_tpu_root(tmp_path, V6E, 4), version="0.2.0")
    shared = torch_tpu.launch_environment(4, [41001, 41002, 41003, 41004], info, session_id="7")
    assert shared == {"TORCH_TPU_SLICEBUILDER_ADDRESSES": "localhost:41001,localhost:41002,localhost:41003,"
                                                          "localhost:41004",
                      "TORCH_TPU_TOPOLOGY": "2,2,1", "TORCH_TPU_XPROF_SESSION_ID": "7",
                      "TORCH_TPU_DEVICES_PER_HOST": "4"}
    plan = build_plan(num_processes=4, num_nodes=1, node_rank=0, master_addr="127.0.0.1", master_port=29500,
                      device_kind="tpu", mixed_precision="no", start_method="spawn", run_id="r", user_env={},
                      cpu_count=8, device_env=shared)
    assert [r.env["LOCAL_RANK"] for r in plan.ranks] == ["0", "1", "2", "3"]
    assert all(r.env.items() >= shared.items() and r.device == "tpu" for r in plan.ranks)
    assert plan.dist_backend == "tpu" and "PJRT_LOCAL_PROCESS_RANK" not in plan.ranks[0].env
    assert "ACCELERATE_USE_CPU" not in plan.ranks[0].env


# --- the warm start process -----------------------------------------------------------------------
def test_the_start_process_withholds_device_backends_only_where_torch_tpu_has_devices(tmp_path):
    withheld = withhold_device_backends({}, fake_tpu_root(tmp_path, V6E, 4), "0.2.0")
    assert withheld == {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "NOTEBOOK_LAUNCH_DEVICE_BACKENDS_WITHHELD": "1"}
    assert withhold_device_backends({}, fake_tpu_root(tmp_path), "0.2.0") == {}
    assert withhold_device_backends({}, fake_tpu_root(tmp_path, V6E, 4), None) == {}
    off = {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    assert withhold_device_backends(off, fake_tpu_root(tmp_path, V6E, 4), "0.2.0") == {}


# --- the guard -----------------------------------------------------------------------------------
class FakeTorchTpuModuleStandIn(types.ModuleType):
    """A FAKE ``torch.tpu`` (torch_tpu's public module): only ``is_initialized``, as it answers."""

    def __init__(self, initialized):
        super().__init__("torch.tpu")
        self.is_initialized = lambda: initialized


@pytest.mark.parametrize("initialized", [True, False])
def test_a_notebook_holding_torch_tpus_runtime_is_refused(monkeypatch, initialized):
    monkeypatch.setitem(sys.modules, "torch_tpu", types.ModuleType("torch_tpu"))
    monkeypatch.setitem(sys.modules, "torch.tpu", FakeTorchTpuModuleStandIn(initialized))
    assert torch_tpu.runtime_initialized() is initialized
    if not initialized:
        preflight.check_runtime_not_initialized()
        return
    with pytest.raises(GuardError, match=r"TorchTPU's runtime is already initialized .* restart the kernel"):
        preflight.check_runtime_not_initialized()


def test_without_torch_tpu_imported_nothing_is_asked():
    assert not torch_tpu.runtime_initialized({"torch.tpu": FakeTorchTpuModuleStandIn(True)})
