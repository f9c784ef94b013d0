"""The TorchTPU lane: the real torch_tpu 0.2.0 (torch 2.13, libtpu) on a machine without a TPU chip.

What runs here: the import and detection, the per-rank environment checked against what
torch_tpu's own code sets and reads, CPU launches with torch_tpu installed, and a TPU launch asked
for on this chipless machine refused before anything starts. What needs a chip (TorchTPU ranks
running) is scripts/test-tpu.sh. Runs only in .venv-tpu (``bash scripts/test-tpu-lane.sh``);
elsewhere it is skipped."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch_tpu_module = pytest.importorskip("torch_tpu", reason="torch_tpu is not installed: bash scripts/test-tpu-lane.sh")
import psutil  # noqa: E402
import torch  # noqa: E402
from helpers.fake_tpu_machine import V6E, fake_tpu_root  # noqa: E402
from torch_tpu._internal.utils import hardware  # noqa: E402

from notebook_launch import LaunchArgumentError, notebook_launcher  # noqa: E402
from notebook_launch.detect import torch_tpu  # noqa: E402
from notebook_launch.wire.plan import rank_environment  # noqa: E402

PACKAGE = Path(torch_tpu_module.__file__).parent
CLEAN_ENV = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_TPU_")}


@pytest.fixture(scope="module")
def torch_tpu_files() -> bytes:
    """Every Python and compiled file of the installed torch_tpu, for the names its code reads."""
    return b"\n".join(p.read_bytes() for p in PACKAGE.rglob("*") if p.suffix in (".py", ".so"))


def test_torch_tpu_0_2_0_is_what_this_lane_runs():
    from importlib import metadata
    assert metadata.version("torch_tpu") == "0.2.0" and torch.__version__.startswith("2.13.0")
    assert torch_tpu.torch_tpu_version() == "0.2.0"


def test_our_chip_table_is_torch_tpus_own():
    """The chips TorchTPU drives and the topology per device count: its hardware tables."""
    theirs = {pci: (hardware._PCI_DEVICE_ID_TO_NAME[pci], dict(table))
              for pci, table in hardware._TOPOLOGY_BY_TPU_PCI_DEVICE_ID.items()}
    assert theirs == torch_tpu.TORCH_TPU_CHIPS


def test_the_shared_variables_are_what_set_tpu_launch_env_sets():
    """torch_tpu's own launcher preparation (set_tpu_launch_env, single host, 4 ranks) sets the
    same variables as ours, in the same shape; the topology is given (no chip here to read it from)."""
    code = textwrap.dedent("""
        import json, os
        from torch_tpu._internal.distributed import distributed
        before = dict(os.environ)
        distributed.set_tpu_launch_env(nproc_per_node=4)
        changed = {k: v for k, v in os.environ.items() if before.get(k) != v or k.startswith("TORCH_TPU_")}
        print("SET=" + json.dumps(changed))
    """)
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", code], env=dict(CLEAN_ENV, TORCH_TPU_TOPOLOGY="2,2,1"),
                         capture_output=True, text=True, timeout=300, check=True).stdout
    theirs = json.loads(out.split("SET=", 1)[1].splitlines()[0])
    info = torch_tpu.TorchTpuInfo(True, "0.2.0", 4, "TPU v6e", torch_tpu.TORCH_TPU_CHIPS[V6E][1])
    ours = torch_tpu.launch_environment(4, [41001, 41002, 41003, 41004], info)
    assert set(theirs) == set(ours) - {torch_tpu.DEVICES_PER_HOST}
    address = re.compile(r"^localhost:\d+$")
    for addresses in (theirs, ours):
        listed = addresses[torch_tpu.SLICEBUILDER_ADDRESSES].split(",")
        assert len(listed) == 4 and all(address.match(a) for a in listed)
    assert theirs[torch_tpu.TOPOLOGY] == ours[torch_tpu.TOPOLOGY] == "2,2,1"
    assert theirs[torch_tpu.XPROF_SESSION_ID].isdigit() and ours[torch_tpu.XPROF_SESSION_ID].isdigit()


def test_every_variable_a_rank_gets_for_torch_tpu_is_one_its_code_reads(torch_tpu_files):
    """No guessed name: each TORCH_TPU_ variable we set, and torch.distributed's that its runtime
    reads per process, is named in torch_tpu's own files; torch_xla's PJRT_LOCAL_PROCESS_RANK is not
    (so a launch does not set it)."""
    info = torch_tpu.TorchTpuInfo(True, "0.2.0", 4, "TPU v6e", torch_tpu.TORCH_TPU_CHIPS[V6E][1])
    names = set(torch_tpu.launch_environment(4, [1, 2, 3, 4], info))
    env = rank_environment(global_rank=1, local_rank=1, num_processes=4, num_nodes=1, node_rank=0, world_size=4,
                           master_addr="127.0.0.1", master_port=29500, device_kind="tpu", mixed_precision="no",
                           run_id="r", user_env={}, cpu_count=8)
    names |= {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"} & set(env)
    assert len(names) == 9
    missing = [n for n in sorted(names) if n.encode() not in torch_tpu_files]
    assert not missing, f"torch_tpu 0.2.0 reads none of {missing}"
    assert b"PJRT_LOCAL_PROCESS_RANK" not in torch_tpu_files
    assert b"expected environment variable LOCAL_RANK to be in [0, %d) (TORCH_TPU_DEVICES_PER_HOST)" in torch_tpu_files


def test_import_and_detection_on_this_chipless_machine(tmp_path):
    import torch_tpu as real  # noqa: F401  (imported: libtpu loaded, no device)
    assert not torch.tpu.is_initialized() and not torch_tpu.runtime_initialized()  # type: ignore[attr-defined]
    here = torch_tpu.detect_torch_tpu("/")
    assert (here.installed, here.version, here.devices) == (True, "0.2.0", hardware.get_tpu_device_count())
    assert here.devices == 0 and not here.can_launch
    fake = torch_tpu.detect_torch_tpu(fake_tpu_root(tmp_path, V6E, 4))   # the real version, a FAKE machine
    assert (fake.installed, fake.version, fake.devices, fake.topologies[4]) == (True, "0.2.0", 4, "2,2,1")


def nothing(x):
    return x


def test_a_tpu_launch_asked_for_on_this_chipless_machine_is_refused_before_anything_starts(monkeypatch, tmp_path):
    monkeypatch.setenv("NOTEBOOK_LAUNCH_DEVICE", "tpu")
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(LaunchArgumentError, match="no TPU device TorchTPU can use .* What to do"):
        notebook_launcher(nothing, args=(1,), ui="none", log_dir=str(tmp_path / "logs"))
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before


def what_a_rank_has(scale):
    import torch as t
    rank = int(os.environ["RANK"])
    return {"rank": rank, "torch_tpu": "torch_tpu" in sys.modules, "tensor": t.arange(3.0) * scale * (rank + 1),
            "device_env": sorted(k for k in os.environ if k.startswith("TORCH_TPU_"))}


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_cpu_launches_are_unchanged_with_torch_tpu_installed(tmp_path, start_method):
    """As without torch_tpu: CPU ranks, their results, and nothing of TorchTPU's launch in their
    environment. Spawned ranks have torch_tpu loaded as a fresh Python's `import torch` has it."""
    results = notebook_launcher(what_a_rank_has, args=(2.0,), num_processes=2, start_method=start_method,
                                ui="none", log_dir=str(tmp_path / "logs"), timeout=240)
    assert [r["rank"] for r in results] == [0, 1]
    assert torch.equal(results[1]["tensor"], torch.tensor([0.0, 4.0, 8.0]))
    assert all(r["device_env"] == [] for r in results)
    if start_method == "spawn":
        assert all(r["torch_tpu"] for r in results)


def test_a_rank_loads_withheld_device_backends_with_its_own_environment():
    """A start process that imported torch without its device backends (where TorchTPU has devices)
    forks ranks that load them themselves (rank.device_backends), as `import torch` would."""
    code = textwrap.dedent("""
        import os, sys
        import torch
        assert "torch_tpu" not in sys.modules
        os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "1"   # the rank's own environment
        from notebook_launch.wire import protocol
        from notebook_launch.rank import device_backends
        r, w = os.pipe()
        print(device_backends.load(protocol.EventWriter(w)), "torch_tpu" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, timeout=300,
                         env=dict(CLEAN_ENV, TORCH_DEVICE_BACKEND_AUTOLOAD="0"), check=True).stdout
    assert out.strip().splitlines()[-1] == "True True"
