"""TPU / XLA detection and backend choice, without torch_xla and without a TPU.

There is no TPU chip here, so each machine is a fake: a folder standing in for
``/`` (sysfs PCI entries, /dev nodes) plus an environment dict, built from what
Colab, Kaggle and Cloud TPU VMs show. Runs in the main .venv (torch_xla is not
installable next to torch 2.13); the real torch_xla lane is tests/xla/.
"""
from __future__ import annotations

import os
import sys
import types

import pytest

from notebook_launch import GuardError, LaunchArgumentError, notebook_launcher
from notebook_launch.planning import preflight
from notebook_launch.engines import launcher_for
from notebook_launch.detect import xla as xla_env
from notebook_launch.detect.platform import Probe
from notebook_launch.detect.platform import detect as platform_detect
from notebook_launch.detect.xla import (
    XlaLayout, detect_xla, expected_layout, resolve_num_ranks, stale_tpu_variables, xla_launch_info,
)


def fake_root(tmp_path, *, pci=(), accel=0, vfio=0, accel_dir=False):
    """A fake ``/``: PCI devices as (vendor, device) pairs, /dev/accelN and /dev/vfio/N nodes."""
    root = tmp_path / f"root{len(list(tmp_path.glob('root*')))}"
    for i, (vendor, device) in enumerate(pci):
        d = root / "sys/bus/pci/devices" / f"0000:00:{i + 4:02x}.0"
        d.mkdir(parents=True)
        (d / "vendor").write_text(vendor + "\n")
        (d / "device").write_text(device + "\n")
    (root / "dev/vfio").mkdir(parents=True)
    (root / "dev/vfio/vfio").write_text("")   # the container device every vfio host has
    for i in range(accel):
        (root / f"dev/accel{i}").write_text("")
    for i in range(vfio):
        (root / f"dev/vfio/{i}").write_text("")
    if accel_dir:  # Linux's accel subsystem (Intel/AMD NPUs): /dev/accel/accel0, not a TPU
        (root / "dev/accel").mkdir()
        (root / "dev/accel/accel0").write_text("")
    return str(root)


@pytest.fixture
def fake_colab_tpu_machine(tmp_path):
    """Colab's TPU runtime: a v2-8 TPU VM (4 chips, 2 cores each) seen from a Colab kernel."""
    environ = {"COLAB_RELEASE_TAG": "release-colab_20250101-060000_RC00", "COLAB_GPU": "",
               "TPU_ACCELERATOR_TYPE": "v2-8"}
    return environ, fake_root(tmp_path, pci=[("0x1ae0", "0x0027")] * 4, accel=4)


@pytest.fixture
def fake_kaggle_tpu_machine(tmp_path):
    """Kaggle's TPU VM v3-8: it leaves TPU_PROCESS_ADDRESSES and CLOUD_TPU_TASK_ID set."""
    environ = {"KAGGLE_KERNEL_RUN_TYPE": "Interactive", "KAGGLE_URL_BASE": "https://www.kaggle.com",
               "TPU_ACCELERATOR_TYPE": "v3-8", "TPU_NAME": "local",
               "TPU_PROCESS_ADDRESSES": "local:8476,local:8477,local:8478,local:8479",
               "CLOUD_TPU_TASK_ID": "0"}
    return environ, fake_root(tmp_path, accel=4)  # no sysfs in the container: /dev only


@pytest.fixture
def fake_v5e_tpu_vm(tmp_path):
    """A Cloud TPU VM v5litepod-8: 8 chips behind vfio, one device per chip."""
    environ = {"TPU_ACCELERATOR_TYPE": "v5litepod-8", "TPU_WORKER_ID": "0"}
    return environ, fake_root(tmp_path, pci=[("0x1ae0", "0x0063")] * 8, vfio=8)


@pytest.fixture
def fake_cpu_machine(tmp_path):
    """No TPU: a GPU-less workstation with an NPU under /dev/accel/ and a NIC on PCI."""
    return {}, fake_root(tmp_path, pci=[("0x8086", "0x1533")], accel_dir=True)


# --- detection ----------------------------------------------------------------
def test_colab_v2_8_is_four_processes_of_two_threads(fake_colab_tpu_machine):
    environ, root = fake_colab_tpu_machine
    info = detect_xla(environ, root, modules={}, xla_installed=True)
    assert info.has_tpu and info.platform == "colab"
    assert (info.chips, info.tpu_version, info.accelerator_type) == (4, 2, "v2-8")
    assert info.device_type == "TPU" and info.wants_xla
    assert expected_layout(info, environ) == XlaLayout(4, 2)
    assert "4 TPU chip(s) on PCI" in info.evidence


def test_kaggle_v3_8_found_from_dev_accel_and_its_stale_variables_listed(fake_kaggle_tpu_machine):
    environ, root = fake_kaggle_tpu_machine
    info = detect_xla(environ, root, modules={}, xla_installed=True)
    assert info.has_tpu and info.platform == "kaggle" and info.chips == 4
    layout = expected_layout(info, environ)
    assert layout is not None and layout.ordinals == 8
    assert stale_tpu_variables(environ) == ["TPU_PROCESS_ADDRESSES", "CLOUD_TPU_TASK_ID"]


def test_v5e_vm_is_one_process_per_chip(fake_v5e_tpu_vm):
    environ, root = fake_v5e_tpu_vm
    info = detect_xla(environ, root, modules={}, xla_installed=True)
    assert info.platform == "local" and info.tpu_version == 5
    assert expected_layout(info, environ) == XlaLayout(8, 1)


def test_tpu_generation_from_pci_id_when_accelerator_type_is_unset(tmp_path):
    root = fake_root(tmp_path, pci=[("0x1ae0", "0x005e")] * 4)   # TPU v4
    info = detect_xla({}, root, modules={}, xla_installed=True)
    assert info.has_tpu and info.tpu_version == 4
    assert expected_layout(info, {}) == XlaLayout(4, 1)


@pytest.mark.parametrize("accelerator_type, layout", [
    ("v2-8", XlaLayout(4, 2)), ("v3-8", XlaLayout(4, 2)), ("v4-8", XlaLayout(4, 1)),
    ("v5p-8", XlaLayout(4, 1)), ("v5litepod-8", XlaLayout(8, 1)), ("v5litepod-1", XlaLayout(1, 1)),
    ("v6e-1", XlaLayout(1, 1)), ("v6e-8", XlaLayout(8, 1)), ("v3-32", None), ("v6e-16", None),
])
def test_layout_from_the_accelerator_type_when_no_device_is_visible(tmp_path, accelerator_type, layout):
    environ = {"TPU_ACCELERATOR_TYPE": accelerator_type}   # a container that hides /dev and sysfs
    info = detect_xla(environ, fake_root(tmp_path), modules={}, xla_installed=True)
    assert info.has_tpu and info.chips == 0
    assert expected_layout(info, environ) == layout


def test_process_bounds_cap_the_processes(fake_v5e_tpu_vm):
    environ, root = fake_v5e_tpu_vm
    environ = dict(environ, TPU_PROCESS_BOUNDS="2,2,1")
    info = detect_xla(environ, root, modules={}, xla_installed=True)
    assert expected_layout(info, environ) == XlaLayout(4, 1)


def test_no_tpu_on_a_plain_machine(fake_cpu_machine):
    environ, root = fake_cpu_machine
    info = detect_xla(environ, root, modules={}, xla_installed=True)
    assert not info.has_tpu and info.chips == 0 and info.device_type is None
    assert not info.wants_xla
    assert expected_layout(info, environ) is None


def test_vfio_nodes_without_tpu_hints_are_not_a_tpu(tmp_path):
    root = fake_root(tmp_path, vfio=2)   # vfio passthrough of something else
    assert not detect_xla({}, root, modules={}, xla_installed=True).has_tpu


def test_tpu_without_torch_xla_keeps_the_default_backend(fake_colab_tpu_machine):
    environ, root = fake_colab_tpu_machine
    info = detect_xla(environ, root, modules={}, xla_installed=False)
    assert info.has_tpu and not info.wants_xla
    assert xla_launch_info(None, environ, root, xla_installed=False) is None


def test_pjrt_cpu_runs_cpu_num_devices_threads(fake_cpu_machine):
    environ, root = fake_cpu_machine
    environ = {"PJRT_DEVICE": "cpu", "CPU_NUM_DEVICES": "4"}
    info = detect_xla(environ, root, modules={}, xla_installed=True)
    assert info.device_type == "CPU" and info.wants_xla and not info.has_tpu
    assert expected_layout(info, environ) == XlaLayout(1, 4)
    assert expected_layout(info, {"PJRT_DEVICE": "CPU"}) == XlaLayout(1, 1)


def test_pjrt_cuda_is_left_to_the_fork_backend(fake_cpu_machine):
    _, root = fake_cpu_machine
    info = detect_xla({"PJRT_DEVICE": "CUDA"}, root, modules={}, xla_installed=True)
    assert not info.wants_xla
    with pytest.raises(LaunchArgumentError, match="PJRT_DEVICE=CUDA.*start_method='fork'"):
        resolve_num_ranks(None, info)


def test_xla_forced_without_tpu_or_pjrt_device_says_what_to_set(fake_cpu_machine):
    environ, root = fake_cpu_machine
    info = xla_launch_info("xla", environ, root, xla_installed=True)
    assert info is not None   # start_method="xla" always goes through torch_xla
    with pytest.raises(LaunchArgumentError, match="found no TPU.*PJRT_DEVICE=CPU"):
        resolve_num_ranks(None, info, environ)


def test_platform_from_modules_and_environment(tmp_path):
    root = fake_root(tmp_path)
    assert detect_xla({}, root, modules={"google.colab": object()}, xla_installed=True).platform == "colab"
    assert detect_xla({"KAGGLE_KERNEL_RUN_TYPE": "Batch"}, root, modules={}, xla_installed=True).platform == "kaggle"
    assert detect_xla({}, root, modules={}, xla_installed=True).platform == "local"


# --- one detector: the TPU detector and the platform detector give the same answers ----------
def both_detectors(environ, root):
    """(the TPU probe's answer, the platform's answer) for one fake machine."""
    info = detect_xla(environ, root, modules={}, xla_installed=False)
    found = platform_detect(environ, Probe(tpu_root=root))
    return info, found


def assert_agree(info, found):
    assert found.has_tpu == info.has_tpu
    assert found.device_kind == ("xla" if info.has_tpu else "cpu")
    assert found.device_count == (info.local_chips if info.has_tpu else 0)
    assert found.tpu == (info if info.has_tpu else None)


@pytest.mark.parametrize("accelerator_type", ["v4-32", "v6e-16", "v5litepod-32"])
def test_multi_host_slice_known_from_its_name_only_counts_no_local_chips_in_either(tmp_path, accelerator_type):
    """Issue 21: with TPU_ACCELERATOR_TYPE=v4-32 the platform said 16 chips and the TPU probe 0.
    A multi-host slice's name does not say this host's share: both now say 0 (unknown) here,
    and the slice's size is kept for the description."""
    environ = {"TPU_ACCELERATOR_TYPE": accelerator_type}
    info, found = both_detectors(environ, fake_root(tmp_path))
    assert_agree(info, found)
    assert info.has_tpu and info.local_chips == 0 and info.slice_chips > 8
    assert expected_layout(info, environ) is None   # this host's share is not known from the name
    assert f"{info.slice_chips} chip(s) in the slice" in found.describe()


def test_single_host_slice_name_gives_the_same_chips_to_both(tmp_path):
    info, found = both_detectors({"TPU_ACCELERATOR_TYPE": "v4-8"}, fake_root(tmp_path))
    assert_agree(info, found)
    assert found.device_count == 4


@pytest.mark.parametrize("device_id, version", sorted(xla_env.TPU_PCI_DEVICES.items()))
def test_tpu_on_pci_only_is_a_tpu_for_both_detectors(tmp_path, device_id, version):
    """Issue 21: a TPU on PCI only (no /dev files, no variables): the TPU probe found it, the
    platform did not (it counted /dev files). Every TPU PCI device id, through both."""
    root = fake_root(tmp_path, pci=[(xla_env.GOOGLE_PCI_VENDOR, device_id)] * 4)
    info, found = both_detectors({}, root)
    assert_agree(info, found)
    assert (found.device_kind, found.device_count, info.tpu_version) == ("xla", 4, version)


def test_pci_devices_of_other_vendors_are_no_tpu(tmp_path):
    root = fake_root(tmp_path, pci=[("0x10de", "0x0027"), ("0x8086", "0x005e")])  # ids of TPUs, not Google's
    info, found = both_detectors({}, root)
    assert_agree(info, found)
    assert not found.has_tpu


@pytest.mark.parametrize("variable", [*xla_env.TPU_ENV_HINTS, "PJRT_DEVICE"])
def test_every_tpu_variable_is_a_tpu_for_both_detectors(tmp_path, variable):
    value = {"PJRT_DEVICE": "TPU", "TPU_ACCELERATOR_TYPE": "v3-8"}.get(variable, "set")
    info, found = both_detectors({variable: value}, fake_root(tmp_path))
    assert_agree(info, found)
    assert found.has_tpu and found.evidence


def test_pjrt_cpu_is_no_tpu_for_either(tmp_path):
    info, found = both_detectors({"PJRT_DEVICE": "CPU"}, fake_root(tmp_path))
    assert_agree(info, found)
    assert not found.has_tpu


@pytest.mark.parametrize("machine", ["accel", "vfio+TPU variable", "vfio+libtpu", "vfio alone"])
def test_tpu_device_files_agree_between_detectors(tmp_path, machine):
    """/dev/accelN (v2-v4) count; VFIO groups (v5e, v6e) count on a TPU VM: a TPU_ variable
    or libtpu installed (under the fake root); VFIO alone is a GPU passthrough host."""
    environ = {"TPU_WORKER_ID": "0"} if machine == "vfio+TPU variable" else {}
    root = fake_root(tmp_path, accel=4) if machine == "accel" else fake_root(tmp_path, vfio=4)
    if machine == "vfio+libtpu":
        os.makedirs(os.path.join(root, "lib"))
        open(os.path.join(root, "lib", "libtpu.so"), "w").close()
    info, found = both_detectors(environ, root)
    assert_agree(info, found)
    assert found.device_count == (0 if machine == "vfio alone" else 4)


@pytest.mark.parametrize("variable, service", [("KAGGLE_DATA_PROXY_URL", "kaggle"),
                                               ("COLAB_BACKEND_VERSION", "colab")])
def test_hosted_service_variables_agree_between_detectors(tmp_path, variable, service):
    environ = {variable: "set by the service"}
    info = detect_xla(environ, fake_root(tmp_path), modules={}, xla_installed=True)
    found = platform_detect(environ, Probe())
    assert info.platform == service and found.hosted == service


def test_detection_does_not_import_torch_xla(fake_colab_tpu_machine):
    environ, root = fake_colab_tpu_machine
    had = "torch_xla" in sys.modules
    detect_xla(environ, root)
    assert ("torch_xla" in sys.modules) == had


# --- num_processes on XLA -------------------------------------------------------
def test_num_processes_counts_xla_devices(fake_colab_tpu_machine):
    environ, root = fake_colab_tpu_machine
    info = detect_xla(environ, root, modules={}, xla_installed=True)
    assert resolve_num_ranks(None, info, environ) == 8
    assert resolve_num_ranks(8, info, environ) == 8
    assert resolve_num_ranks(1, info, environ) == 1


def test_num_processes_that_pjrt_cannot_run_is_refused_with_the_valid_values(fake_colab_tpu_machine):
    environ, root = fake_colab_tpu_machine
    info = detect_xla(environ, root, modules={}, xla_installed=True)
    with pytest.raises(LaunchArgumentError) as err:
        resolve_num_ranks(4, info, environ)
    message = str(err.value)
    assert "num_processes=4" in message and "num_processes=None or 8" in message
    assert "num_processes=1" in message and "4 process(es) x 2 thread(s)" in message
    with pytest.raises(LaunchArgumentError, match="num_processes must be None"):
        resolve_num_ranks(0, info, environ)


def test_unknown_tpu_layout_needs_num_processes(tmp_path):
    root = fake_root(tmp_path, vfio=4)
    environ = {"TPU_NAME": "my-tpu"}   # a TPU, but neither its type nor its chips' PCI ids are known
    info = detect_xla(environ, root, modules={}, xla_installed=True)
    assert info.has_tpu and expected_layout(info, environ) is None
    with pytest.raises(LaunchArgumentError, match="Pass num_processes=<number of TPU devices>"):
        resolve_num_ranks(None, info, environ)
    assert resolve_num_ranks(4, info, environ) == 4   # checked against torch_xla in rank 0


# --- the runtime-initialized guard ----------------------------------------------------
@pytest.fixture
def fake_torch_xla_with_started_runtime(monkeypatch):
    """torch_xla cannot be imported next to torch 2.13: a stand-in module whose
    runtime reports itself started, as torch_xla._XLAC does after xm.xla_device()."""
    fake = types.ModuleType("torch_xla")
    fake.__dict__.update(_XLAC=types.SimpleNamespace(_xla_runtime_is_initialized=lambda: True))
    monkeypatch.setitem(sys.modules, "torch_xla", fake)
    return fake


def test_started_xla_runtime_is_refused_with_what_to_do(fake_torch_xla_with_started_runtime):
    assert xla_env.runtime_initialized()
    with pytest.raises(GuardError) as err:
        preflight.check_runtime_not_initialized()
    message = str(err.value)
    assert "restart the kernel" in message and "inside the function" in message
    fake_torch_xla_with_started_runtime._XLAC = types.SimpleNamespace(
        _xla_runtime_is_initialized=lambda: False)
    preflight.check_runtime_not_initialized()


def test_runtime_not_started_when_torch_xla_was_never_imported(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch_xla", raising=False)
    assert not xla_env.runtime_initialized()


# --- backend choice --------------------------------------------------------------
def test_get_backend_xla():
    from notebook_launch.engines.xla.launcher import XlaBackend
    backend = launcher_for("xla")
    assert isinstance(backend, XlaBackend) and backend.name == "xla"


def test_launch_info_follows_start_method(fake_colab_tpu_machine, fake_cpu_machine):
    environ, root = fake_colab_tpu_machine
    tpu = xla_launch_info(None, environ, root, xla_installed=True)
    assert tpu is not None and tpu.has_tpu
    assert xla_launch_info("fork", environ, root, xla_installed=True) is None
    cpu_environ, cpu_root = fake_cpu_machine
    assert xla_launch_info(None, cpu_environ, cpu_root, xla_installed=True) is None
    assert xla_launch_info("xla", {"PJRT_DEVICE": "CPU"}, cpu_root, xla_installed=True) is not None


@pytest.mark.skipif(xla_env.torch_xla_installed(), reason="torch_xla is installed in this environment")
def test_start_method_xla_without_torch_xla_says_how_to_install():
    with pytest.raises(LaunchArgumentError, match=r"start_method='xla' needs torch_xla.*pip install"):
        notebook_launcher(lambda: None, start_method="xla", ui="none")


def test_start_method_choices_name_xla():
    with pytest.raises(LaunchArgumentError, match="'xla'"):
        notebook_launcher(lambda: None, start_method="tpu", ui="none")  # type: ignore[arg-type]  # on purpose


@pytest.mark.skipif(xla_env.torch_xla_installed(), reason="torch_xla is installed in this environment")
def test_pjrt_device_without_torch_xla_still_launches_on_cpu(monkeypatch, tmp_path):
    monkeypatch.setenv("PJRT_DEVICE", "TPU")   # a stale variable must not break CPU launches
    results = notebook_launcher(_rank_and_parent, num_processes=2, ui="none", log_dir=str(tmp_path))
    assert results == [("0", os.getpid()), ("1", os.getpid())]   # forked ranks, no XLA launcher between


def _rank_and_parent():
    return os.environ["RANK"], os.getppid()


# --- issue 26: one-device refusals, TPU7x, images that set the process bounds --------------

def test_more_than_the_one_device_of_a_v5e_1_says_it_has_one(tmp_path):
    environ = {"COLAB_RELEASE_TAG": "release-colab_20250101-060000_RC00", "TPU_ACCELERATOR_TYPE": "v5litepod-1"}
    info = detect_xla(environ, fake_root(tmp_path, pci=[("0x1ae0", "0x0063")], vfio=1), modules={},
                      xla_installed=True)
    with pytest.raises(LaunchArgumentError) as err:
        resolve_num_ranks(8, info, environ)
    message = str(err.value)
    assert "num_processes=8" in message and "this TPU has one XLA device" in message
    assert "v5litepod-1" in message and "num_processes=1 or None" in message
    assert "None or 1 for all of them" not in message


def test_more_than_one_cpu_device_says_how_to_get_more(fake_cpu_machine):
    environ, root = fake_cpu_machine
    environ = dict(environ, PJRT_DEVICE="CPU")
    info = detect_xla(environ, root, modules={}, xla_installed=True)
    with pytest.raises(LaunchArgumentError) as err:
        resolve_num_ranks(4, info, environ)
    assert "runs one XLA device here" in str(err.value) and "CPU_NUM_DEVICES=4" in str(err.value)


def test_tpu7x_is_found_on_pci_and_by_its_type_name(tmp_path):
    root = fake_root(tmp_path, pci=[("0x1ae0", "0x0076")] * 4, vfio=4)   # torch_xla 2.9 lists 0x0076
    info = detect_xla({}, root, modules={}, xla_installed=True)
    assert info.has_tpu and info.chips == 4 and info.tpu_version == 7
    assert expected_layout(info, {}) is None   # its ordinals are asked for (or checked by rank 0)
    with pytest.raises(LaunchArgumentError, match="num_processes=None: cannot tell"):
        resolve_num_ranks(None, info, {})
    assert xla_env.tpu_version_from_type("tpu7x-8") == 7 and xla_env.tpu_version_from_type("v6e-8") == 6


@pytest.mark.parametrize("version_id, accelerator_type, bounds, layout", [
    ("0x005e", "v4-8", {"TPU_CHIPS_PER_PROCESS_BOUNDS": "2,2,1", "TPU_PROCESS_BOUNDS": "1,1,1"}, XlaLayout(1, 4)),
    ("0x0027", "v3-8", {"TPU_CHIPS_PER_PROCESS_BOUNDS": "2,2,1", "TPU_PROCESS_BOUNDS": "1,1,1"}, XlaLayout(1, 8)),
    ("0x0063", "v5litepod-8", {"TPU_CHIPS_PER_PROCESS_BOUNDS": "2,2,1"}, XlaLayout(2, 4)),
    ("0x0063", "v5litepod-8", {"TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1", "TPU_PROCESS_BOUNDS": "2,4,1"},
     XlaLayout(8, 1)),
    ("0x0063", "v5litepod-8", {"TPU_PROCESS_BOUNDS": "1,1,1"}, XlaLayout(1, 1)),   # torch_xla: 1 chip
])
def test_an_image_that_sets_the_bounds_plans_every_device_torch_xla_runs(tmp_path, version_id, accelerator_type,
                                                                          bounds, layout):
    """One process driving several chips (TPU_CHIPS_PER_PROCESS_BOUNDS) runs one thread per
    device of all of them: planned as that many ranks, not one."""
    chips = 8 if accelerator_type.startswith("v5") else 4
    environ = {"TPU_ACCELERATOR_TYPE": accelerator_type, **bounds}
    info = detect_xla(environ, fake_root(tmp_path, pci=[("0x1ae0", version_id)] * chips), modules={},
                      xla_installed=True)
    assert expected_layout(info, environ) == layout
    assert resolve_num_ranks(None, info, environ) == layout.ordinals


def test_launch_target_reads_one_machine_for_both_detectors(fake_v5e_tpu_vm):
    """launch_target's platform and its XLA decision read the same (fake) root: the TPU found on
    its PCI and VFIO is the platform's TPU too (before, the platform read this machine's /dev)."""
    from notebook_launch.planning.target import launch_target
    environ, root = fake_v5e_tpu_vm
    target = launch_target(None, None, environ=environ, root=root)
    info = detect_xla(environ, root, modules={}, xla_installed=False)
    assert target.where.has_tpu and target.where.device_count == info.local_chips == 8
    assert target.where.tpu is not None and target.where.tpu.chips == 8
