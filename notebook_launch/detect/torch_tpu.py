"""TorchTPU (``torch_tpu``): is it installed, which TPU devices can it drive here, and what does a
launch of one rank per device need to tell it?

TorchTPU is the PyTorch-native TPU backend that replaces torch_xla (device ``tpu`` through
PrivateUse1). Its own launcher contract (torch_tpu 0.2.0,
``torch_tpu/_internal/distributed/distributed.py``: ``set_tpu_launch_env``) is one process per TPU
device, started by any spawn-class launcher (``torch.multiprocessing.spawn``, torchrun), after the
parent decided for every rank alike:

- ``TORCH_TPU_SLICEBUILDER_ADDRESSES``: one ``localhost:<free port>`` per rank (single host);
- ``TORCH_TPU_TOPOLOGY``: the mesh of the devices used, from its own table per chip generation
  and device count (``torch_tpu/_internal/utils/hardware.py``);
- ``TORCH_TPU_XPROF_SESSION_ID``: one profiling session id;

and each rank has torch.distributed's ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT``; its runtime checks ``LOCAL_RANK`` against ``TORCH_TPU_DEVICES_PER_HOST``
(its node-local store is off without it) and derives ``TPU_VISIBLE_CHIPS`` and the process bounds
itself. torch_xla's ``PJRT_LOCAL_PROCESS_RANK`` is read by no file of torch_tpu 0.2.0, so it is
not set. tests/tpu/ checks these names and tables against the installed torch_tpu.

Like ``detect.xla`` this never imports torch_tpu (an import loads libtpu and takes seconds): it
reads sysfs and /dev under ``root``, and takes ``environ`` and the installed version as
parameters so tests describe other machines with fakes.
"""
from __future__ import annotations

import logging
import os
import sys
import time
import warnings
from dataclasses import dataclass, field
from importlib import metadata
from typing import Mapping, Sequence

from ..errors import LaunchArgumentError
from . import pci

log = logging.getLogger("notebook_launch")

GOOGLE_PCI_VENDOR = "0x1ae0"
# torch_tpu 0.2.0's ``hardware._TOPOLOGY_BY_TPU_PCI_DEVICE_ID`` and ``_PCI_DEVICE_ID_TO_NAME``:
# PCI device id -> (its name for the chip, devices on one host -> TORCH_TPU_TOPOLOGY). TPU v2 and
# v3 (0x0027: Colab's former v2-8, Kaggle's v3-8) are not among them: TorchTPU does not drive them.
TORCH_TPU_CHIPS: dict[str, tuple[str, dict[int, str]]] = {
    "0x005e": ("TPU v4", {1: "1,1,1", 2: "1,2,1", 4: "2,2,1", 8: "2,2,2"}),
    "0x0062": ("TPU v5p", {1: "1,1,1", 2: "1,2,1", 4: "2,2,1", 8: "2,2,2"}),
    "0x0063": ("TPU v5e", {1: "1,1,1", 4: "2,2,1", 8: "2,4,1"}),
    "0x006f": ("TPU v6e", {1: "1,1,1", 4: "2,2,1", 8: "2,4,1"}),
    "0x0076": ("TPU v7", {2: "1,1,1,2", 4: "1,2,1,2", 8: "2,2,1,2"}),
}
# What the parent decides once for every rank (distributed.set_tpu_launch_env), and the count the
# runtime checks LOCAL_RANK against.
SLICEBUILDER_ADDRESSES = "TORCH_TPU_SLICEBUILDER_ADDRESSES"
TOPOLOGY = "TORCH_TPU_TOPOLOGY"
XPROF_SESSION_ID = "TORCH_TPU_XPROF_SESSION_ID"
DEVICES_PER_HOST = "TORCH_TPU_DEVICES_PER_HOST"
# "tpu": TorchTPU ranks wherever it can drive a chip; "cpu": CPU ranks even where a TPU is found.
DEVICE_VARIABLE = "NOTEBOOK_LAUNCH_DEVICE"
DEVICE_CHOICES = ("tpu", "cpu")


@dataclass(frozen=True)
class TorchTpuInfo:
    """What this machine offers TorchTPU, found without importing it."""
    installed: bool                  # torch_tpu importable (not imported)
    version: str | None              # its installed version ("0.2.0")
    devices: int                     # TPU devices TorchTPU counts here: Google TPU PCI functions it knows,
                                     # each exposed through VFIO (hardware._scan_pci_tpus)
    chip_name: str | None = None     # "TPU v6e"
    topologies: Mapping[int, str] = field(default_factory=dict)   # devices used -> TORCH_TPU_TOPOLOGY
    other_chips: tuple[str, ...] = ()   # Google TPU chips here TorchTPU does not drive (PCI ids)
    evidence: tuple[str, ...] = ()

    @property
    def can_launch(self) -> bool:
        return self.installed and self.devices > 0 and bool(self.topologies)

    def describe(self) -> str:
        """One line for messages and ``notebook-launch env``."""
        stack = f"torch_tpu {self.version}" if self.installed else "torch_tpu not installed"
        if self.devices:
            chips = f"{self.devices} {self.chip_name or 'TPU'} device(s) TorchTPU can use"
        elif self.other_chips:
            chips = f"TPU chips TorchTPU does not drive (PCI id {', '.join(sorted(set(self.other_chips)))}: v2/v3)"
        else:
            chips = "no TPU device TorchTPU can use"
        return f"{stack}; {chips}"


_VERSION_KEY = "torch_tpu version"


def torch_tpu_version() -> str | None:
    """Installed version from its metadata (None: not installed); never imports it. Kept
    ``pci.FRESH_FOR`` seconds (``pci.kept``), as the other TPU facts are: the metadata search
    walks every folder of ``sys.path`` (about 0.4 ms of every warm launch's CPU). A launch that
    asks for TorchTPU ranks looks again (``forget_version``), so it is never refused on a kept answer."""
    return pci.kept(_VERSION_KEY, _read_version)


def forget_version() -> None:
    """Look for torch_tpu's install afresh at the next ``torch_tpu_version``."""
    pci.forget(_VERSION_KEY)


def _read_version() -> str | None:
    try:
        return metadata.version("torch_tpu")
    except metadata.PackageNotFoundError:
        return None


def detect_torch_tpu(root: str | None = "/", version: str | None | bool = True) -> TorchTpuInfo:
    """Count the TPU devices TorchTPU would use, as its ``hardware._scan_pci_tpus`` counts them:
    Google PCI functions with a device id it knows, whose IOMMU group is a file in /dev/vfio.
    ``root``: where sysfs and /dev are (a test's fake machine; None: look at no files);
    ``version``: the installed torch_tpu version, None when it is not installed (True: look)."""
    found = torch_tpu_version() if version is True else version
    installed = found is not None
    evidence: list[str] = [f"torch_tpu {found} installed"] if installed else []
    devices, name, others = 0, None, []
    topologies: dict[int, str] = {}
    if root is not None:
        for path, device_id in pci.google_functions(root):
            if device_id not in TORCH_TPU_CHIPS:
                others.append(device_id)
                continue
            if not _exposed_through_vfio(path, root):
                continue
            devices += 1
            if name is None:
                name, topologies = TORCH_TPU_CHIPS[device_id]
    if devices:
        evidence.append(f"{devices} {name} device(s) on PCI, each in /dev/vfio")
    return TorchTpuInfo(installed=installed, version=str(found) if installed else None, devices=devices,
                        chip_name=name, topologies=dict(topologies), other_chips=tuple(others),
                        evidence=tuple(evidence))


def _exposed_through_vfio(path: str, root: str) -> bool:
    """The device's IOMMU group (a link whose name is the group's number) is a file in /dev/vfio."""
    try:
        group = os.path.basename(os.readlink(os.path.join(path, "iommu_group")))
    except OSError:
        return False
    return os.path.exists(os.path.join(root, "dev/vfio", group))


def requested_device(environ: Mapping[str, str]) -> str | None:
    """``NOTEBOOK_LAUNCH_DEVICE``: "tpu", "cpu" or None (unset: where the machine says)."""
    value = (environ.get(DEVICE_VARIABLE) or "").strip().lower()
    if not value:
        return None
    if value not in DEVICE_CHOICES:
        raise LaunchArgumentError(
            f"{DEVICE_VARIABLE}={environ.get(DEVICE_VARIABLE)!r}: use 'tpu' (TorchTPU ranks, one per TPU "
            f"device), 'cpu' (CPU ranks even where a TPU is found), or leave it unset.")
    return value


def wants_torch_tpu(info: TorchTpuInfo, start_method: str | None, environ: Mapping[str, str]) -> bool:
    """Whether this launch runs TorchTPU ranks. Asked for (``NOTEBOOK_LAUNCH_DEVICE=tpu``): yes, or
    an error before anything starts that says why not. Otherwise: by default where torch_tpu is
    installed and can drive a chip here, the start method is None or "spawn" (TorchTPU's ranks
    start fresh: it refuses a TPU in a forked child), and PJRT_DEVICE does not ask for torch_xla."""
    asked = requested_device(environ)
    if asked == "cpu":
        return False
    if asked == "tpu":
        check_can_launch(info, start_method)
        return True
    return (info.can_launch and start_method in (None, "spawn")
            and not (environ.get("PJRT_DEVICE") or "").strip())


def check_can_launch(info: TorchTpuInfo, start_method: str | None) -> None:
    """Refuse a TorchTPU launch that cannot run here, saying what to do."""
    if not info.installed:
        raise LaunchArgumentError(
            f"{DEVICE_VARIABLE}=tpu asks for TorchTPU ranks, but torch_tpu is not installed. What to do: "
            f"pip install torch_tpu (it needs torch >= 2.11 and Python >= 3.11) on a TPU VM, or unset "
            f"{DEVICE_VARIABLE}.")
    if not info.devices:
        what = ("this machine's TPU chips are v2 or v3, which TorchTPU does not drive (use torch_xla: "
                "start_method='xla')" if info.other_chips else
                "this machine has no TPU device TorchTPU can use (no Google TPU on PCI exposed through "
                "/dev/vfio)")
        raise LaunchArgumentError(
            f"{DEVICE_VARIABLE}=tpu asks for TorchTPU ranks, but {what}. What to do: run on a TPU VM "
            f"(v4 or newer), or unset {DEVICE_VARIABLE} to launch CPU ranks here.")
    if start_method not in (None, "spawn"):
        raise LaunchArgumentError(
            f"start_method={start_method!r} cannot start TorchTPU ranks: each one must start fresh "
            f"(torch_tpu refuses a TPU in a forked process; torch_xla's xmp.spawn is another stack). "
            f"Use start_method=None or 'spawn', or {DEVICE_VARIABLE}=cpu for CPU ranks.")


def resolve_num_ranks(num_processes: int | None, info: TorchTpuInfo) -> int:
    """Ranks of a TorchTPU launch: one per TPU device, every device (None) or a number TorchTPU
    has a topology for (a sub-slice of this host: 1, 4 or 8 devices of a v5e, ...)."""
    counts = sorted(n for n in info.topologies if n <= info.devices)
    if num_processes is None:
        if info.devices not in info.topologies:
            raise LaunchArgumentError(
                f"TorchTPU has no topology for {info.devices} {info.chip_name} device(s) on one host. "
                f"Pass num_processes= one of {counts}.")
        return info.devices
    if num_processes not in counts:
        raise LaunchArgumentError(
            f"num_processes={num_processes} does not fit TorchTPU here: it runs one rank per TPU device, "
            f"on {info.devices} {info.chip_name} device(s) and in a layout it knows: num_processes=None "
            f"(all {info.devices}) or one of {counts}.")
    return num_processes


def launch_environment(num_ranks: int, ports: Sequence[int], info: TorchTpuInfo,
                       session_id: str | None = None) -> dict[str, str]:
    """The TorchTPU variables every rank of a one-host launch has alike (what
    ``set_tpu_launch_env(nproc_per_node=num_ranks)`` sets, decided anew for each launch rather than
    once per process, plus the devices-per-host count the runtime checks LOCAL_RANK against)."""
    if len(ports) != num_ranks:
        raise ValueError(f"{num_ranks} ranks need {num_ranks} slicebuilder ports, got {len(ports)}")
    return {
        SLICEBUILDER_ADDRESSES: ",".join(f"localhost:{port}" for port in ports),
        TOPOLOGY: info.topologies[num_ranks],
        XPROF_SESSION_ID: session_id or str(time.time_ns()),
        DEVICES_PER_HOST: str(num_ranks),
    }


def runtime_initialized(modules: Mapping[str, object] | None = None) -> bool:
    """True when this process started TorchTPU's runtime (a tensor on ``tpu``, ``torch.tpu``
    calls that initialise it): its PJRT client then holds the TPU devices, and no rank could claim
    them. torch_tpu shows it as ``torch.tpu.is_initialized()``; without torch_tpu imported it cannot
    have started, so nothing is imported here."""
    modules = sys.modules if modules is None else modules
    if "torch_tpu" not in modules:
        return False
    tpu = modules.get("torch.tpu")
    check = getattr(tpu, "is_initialized", None)
    if check is None:
        return False
    try:
        with warnings.catch_warnings():   # it is marked experimental and says so on every call
            warnings.simplefilter("ignore")
            return bool(check())
    except Exception:   # why: a runtime that cannot be asked is taken as not started; the ranks report their own error
        log.debug("torch.tpu.is_initialized() failed; assuming the runtime is not started", exc_info=True)
        return False


def note(info: TorchTpuInfo, num_ranks: int) -> str:
    """The launch summary's line about TorchTPU."""
    return (f"TorchTPU: {info.describe()}; {num_ranks} rank(s), one per TPU device, "
            f"topology {info.topologies.get(num_ranks, '?')}")


def describe_stacks(info: TorchTpuInfo, torch_xla_version: str | None, device_kind: str) -> str:
    """``notebook-launch env``'s line: which TPU stack is installed, its version, and which one a
    launch here would use (``device_kind``: the launch's, from ``target.launch_target``)."""
    stacks = [f"torch_tpu {info.version} (TorchTPU)" if info.installed else None,
              f"torch_xla {torch_xla_version}" if torch_xla_version else None]
    installed = " and ".join(s for s in stacks if s) or "none installed"
    if device_kind == "tpu":
        uses = f"a launch runs TorchTPU ranks, one per device ({info.devices} {info.chip_name})"
    elif device_kind == "xla":
        uses = "a launch runs torch_xla's xmp.spawn"
    elif info.installed and info.other_chips:
        uses = "TorchTPU does not drive this machine's v2/v3 chips: a launch runs CPU ranks unless start_method='xla'"
    elif info.installed:
        uses = "no TPU device here: a launch runs CPU ranks (NOTEBOOK_LAUNCH_DEVICE=tpu is refused)"
    else:
        uses = "a launch runs no TPU ranks"
    return f"{installed}; {uses}"
