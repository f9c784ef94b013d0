"""Is there a TPU (or an XLA device) here, and how does torch_xla lay it out?

Everything here reads environment variables, sysfs and /dev only: nothing
imports torch_xla or starts the XLA runtime, because a notebook that starts
it can no longer launch (xmp.spawn refuses: "Runtime is already
initialized"). ``environ`` and ``root`` parameters let tests describe a
machine with fakes (there is no TPU chip here).

Layout facts (torch_xla 2.9, PJRT): xmp.spawn starts one process per local
TPU chip; each process runs one thread per XLA device of its chip: 2 on
TPU v2/v3 (a v2-8/v3-8 is 4 processes x 2 threads), 1 from v4 on. With
PJRT_DEVICE=CPU it runs one process with CPU_NUM_DEVICES threads.
"""
from __future__ import annotations

import glob
import importlib.util
import logging
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Collection, Mapping

from ..errors import LaunchArgumentError
from . import pci
from ..wire.plan import StartMethod
from .hosted import hosted_service

log = logging.getLogger("notebook_launch")

GOOGLE_PCI_VENDOR = "0x1ae0"
# PCI device ids of TPU chips -> TPU generation (torch_xla/_internal/tpu.py lists the ids).
# torch_xla 2.9 lists 0x0027 (v2/v3), 0x005e (v4), 0x0063 (v5e), 0x006f (v6e), 0x0056 and 0x0062
# ("testing only"; v5p here) and 0x0076 (TPU7x).
TPU_PCI_DEVICES = {"0x0027": 3, "0x005e": 4, "0x0056": 5, "0x0062": 5, "0x0063": 5, "0x006f": 6,
                   "0x0076": 7}
# Variables that show a TPU is attached (Cloud TPU VMs, Colab's and Kaggle's TPU runtimes).
TPU_ENV_HINTS = ("TPU_ACCELERATOR_TYPE", "TPU_NAME", "TPU_WORKER_ID", "TPU_WORKER_HOSTNAMES",
                 "TPU_SKIP_MDS_QUERY", "TPU_CHIPS_PER_PROCESS_BOUNDS", "TPU_PROCESS_BOUNDS",
                 "COLAB_TPU_ADDR", "XRT_TPU_CONFIG")
# Set by Kaggle's TPU VM image; left in the environment they make PJRT expect a
# multi-host slice ("Expected 4 worker addresses, got 1"). xmp.spawn sets its own.
STALE_TPU_VARIABLES = ("TPU_PROCESS_ADDRESSES", "CLOUD_TPU_TASK_ID")
XLA_DEVICE_KINDS = ("TPU", "CPU")


@dataclass(frozen=True)
class XlaInfo:
    """What this machine offers torch_xla, found without starting the runtime."""
    has_tpu: bool                   # TPU chips attached here (or PJRT_DEVICE=TPU)
    platform: str                   # "colab", "kaggle" or "local"
    pjrt_device: str | None         # PJRT_DEVICE as set, upper-case ("TPU", "CPU", ...)
    torch_xla_installed: bool       # importable (not imported)
    chips: int = 0                  # TPU chips found on PCI or in /dev
    tpu_version: int | None = None  # 2..6, from TPU_ACCELERATOR_TYPE or the PCI id
    accelerator_type: str | None = None   # e.g. "v2-8", "v5litepod-8"
    evidence: tuple = field(default_factory=tuple)   # what showed it, for messages

    @property
    def slice_chips(self) -> int:
        """Chips in the whole slice TPU_ACCELERATOR_TYPE names (0: unknown)."""
        return slice_chips(self.accelerator_type)

    @property
    def local_chips(self) -> int:
        """Chips attached to this host: found on PCI or in /dev, else from the slice name when
        the slice fits one host (0: unknown, e.g. a v4-32 known from its variables only, whose
        16 chips are spread over 4 hosts). The platform detector counts TPU chips with this."""
        return self.chips or chips_from_accelerator_type(self.accelerator_type) or 0

    @property
    def device_type(self) -> str | None:
        """The PJRT device type xmp.spawn will use: PJRT_DEVICE, else TPU when chips exist."""
        if self.pjrt_device:
            return self.pjrt_device
        return "TPU" if self.has_tpu else None

    @property
    def wants_xla(self) -> bool:
        """Launch through xmp.spawn by default: torch_xla is installed and there is a TPU,
        or PJRT_DEVICE is TPU or CPU (a GPU keeps the fork backend unless asked)."""
        return self.torch_xla_installed and self.device_type in XLA_DEVICE_KINDS


@dataclass(frozen=True)
class XlaLayout:
    """How xmp.spawn will lay out ordinals: processes x threads per process."""
    processes: int
    threads_per_process: int

    @property
    def ordinals(self) -> int:
        return self.processes * self.threads_per_process


def tpu_hints(environ: Mapping[str, str]) -> list[str]:
    """The variables that show a TPU here (PJRT_DEVICE=TPU included)."""
    hints = [k for k in TPU_ENV_HINTS if environ.get(k)]
    if (environ.get("PJRT_DEVICE") or "").strip().upper() == "TPU":
        hints.append("PJRT_DEVICE=TPU")
    return hints


def detect_xla(environ: Mapping[str, str] | None = None, root: str | None = "/",
               modules: Collection[str] | None = None, xla_installed: bool | None = None) -> XlaInfo:
    """Look for TPU chips and XLA settings: the one TPU detector (``detect.platform``
    derives its TPU facts from this). A TPU shows by its variables (``TPU_ENV_HINTS``,
    PJRT_DEVICE=TPU), by Google TPU chips on PCI (sysfs vendor/device ids), by /dev/accel*
    files, or by VFIO groups on a machine with libtpu or a TPU variable. Never imports
    torch_xla. ``environ``, ``root`` (None: look at no files), ``modules`` and
    ``xla_installed`` describe another machine (tests)."""
    env = os.environ if environ is None else environ
    modules = sys.modules if modules is None else modules
    evidence = []
    pjrt = (env.get("PJRT_DEVICE") or "").strip().upper() or None
    if pjrt:
        evidence.append(f"PJRT_DEVICE={pjrt}")
    pci = _pci_tpu_chips(root) if root is not None else []
    chips = len(pci)
    if chips:
        evidence.append(f"{chips} TPU chip(s) on PCI")
    elif root is not None:
        chips = count_tpu_device_files(os.path.join(root, "dev"), env, real_machine=root == "/")
        if chips:
            evidence.append(f"{chips} TPU device file(s) in /dev")
    hints = [k for k in tpu_hints(env) if k != "PJRT_DEVICE=TPU"]
    if hints:
        evidence.append("TPU variables: " + ", ".join(hints))
    accel_type = env.get("TPU_ACCELERATOR_TYPE") or None
    version = tpu_version_from_type(accel_type)
    if version is None and pci:
        version = max(pci)
    has_tpu = chips > 0 or bool(tpu_hints(env))
    hosted, _ = hosted_service(env, modules)
    return XlaInfo(has_tpu=has_tpu, platform=hosted or "local", pjrt_device=pjrt,
                   torch_xla_installed=torch_xla_installed() if xla_installed is None else xla_installed,
                   chips=chips, tpu_version=version,
                   accelerator_type=accel_type, evidence=tuple(evidence))


def count_tpu_device_files(dev: str = "/dev", environ: Mapping[str, str] | None = None,
                           real_machine: bool = True) -> int:
    """TPU chips as device files: /dev/accel<N> (TPU v2-v4), else numbered VFIO groups
    (v5e, v6e), which count only on a TPU VM (GPU passthrough hosts have them too)."""
    accel = _numbered(dev, "accel[0-9]*", real_machine)
    if accel:
        return len(accel)
    vfio = _numbered(dev, "vfio/[0-9]*", real_machine)
    root = os.path.dirname(os.path.normpath(dev))
    return len(vfio) if vfio and _tpu_vm(environ, root, real_machine) else 0


def _tpu_vm(environ: Mapping[str, str] | None = None, root: str = "/", real_machine: bool = True) -> bool:
    """A TPU variable is set, or libtpu is installed (the TPU VM images' /lib/libtpu.so or
    /usr/lib/libtpu.so under ``root``; on this machine also pip's libtpu wheel)."""
    env = os.environ if environ is None else environ
    if any(k.startswith("TPU_") for k in env):
        return True
    if any(os.path.exists(os.path.join(root, p)) for p in ("lib/libtpu.so", "usr/lib/libtpu.so")):
        return True
    if not real_machine:
        return False
    try:  # pip's libtpu wheel; find_spec does not import it
        return importlib.util.find_spec("libtpu") is not None
    except (ImportError, ValueError):
        log.debug("looking for libtpu failed", exc_info=True)
        return False


def tpu_version_from_type(accelerator_type: str | None) -> int | None:
    """'v3-8' -> 3, 'v5litepod-8' -> 5, 'v6e-1' -> 6, 'tpu7x-8' -> 7 (torch_xla's
    ``tpu.version()`` reads ``^(?:v|tpu)(\\d)``)."""
    match = re.match(r"^(?:v|tpu)(\d)", accelerator_type or "")
    return int(match.group(1)) if match else None


def torch_xla_installed() -> bool:
    """Importable, checked without importing it (an import costs seconds and loads libtpu); the
    answer kept a while (``pci.kept``: a search of sys.path, twice per launch)."""
    if "torch_xla" in sys.modules:
        return True
    return pci.kept(_TORCH_XLA, _find_torch_xla)


_TORCH_XLA = "torch_xla installed"


def _find_torch_xla() -> bool:
    try:
        return importlib.util.find_spec("torch_xla") is not None
    except (ImportError, ValueError):
        log.debug("looking for torch_xla failed; treating it as not installed", exc_info=True)
        return False


def expected_layout(info: XlaInfo, environ: Mapping[str, str] | None = None) -> XlaLayout | None:
    """The layout xmp.spawn(nprocs=None) will use, or None when it cannot be known beforehand."""
    env = os.environ if environ is None else environ
    device = info.device_type
    if device == "CPU":
        return XlaLayout(1, _positive_int(env.get("CPU_NUM_DEVICES"), 1))
    if device == "TPU":
        chips = info.local_chips
        if not chips or info.tpu_version is None:
            return None
        if info.tpu_version >= 7:
            # TPU7x: two TensorCores per chip, and torch_xla 2.9 adds a 4th process-bounds
            # dimension for it; how many ordinals xmp.spawn runs there is not known here, so
            # num_processes=None asks for the count and rank 0 checks a given one.
            return None
        return tpu_layout(chips, info.tpu_version, env)
    return None


def tpu_layout(chips: int, tpu_version: int, environ: Mapping[str, str]) -> XlaLayout:
    """torch_xla 2.9's layout on this host: one process per chip (``tpu.num_local_processes``:
    at most TPU_PROCESS_BOUNDS's size), each driving TPU_CHIPS_PER_PROCESS_BOUNDS chips (1
    unless the image sets it; an image set up for one process driving every chip has
    "2,2,1" and "1,1,1") with 2 devices per chip on v2/v3, 1 from v4 on; one thread per device."""
    per_chip = 2 if tpu_version <= 3 else 1
    chips_per_process = min(chips, _mesh_size(environ.get("TPU_CHIPS_PER_PROCESS_BOUNDS")) or 1)
    processes = max(1, chips // chips_per_process)
    bounds = _mesh_size(environ.get("TPU_PROCESS_BOUNDS"))
    if bounds:
        processes = min(processes, bounds)
    return XlaLayout(processes, chips_per_process * per_chip)


def slice_chips(accelerator_type: str | None) -> int:
    """Chips in a TPU slice from its name (0: unknown). v2/v3/v4/v5p names count
    TensorCores (2 per chip), v5e ("v5litepod", "v5e") and v6e count chips."""
    match = re.match(r"^v(\d)([a-z]*)-(\d+)$", (accelerator_type or "").strip().lower())
    if not match:
        return 0
    version, variant, count = int(match.group(1)), match.group(2), int(match.group(3))
    if _names_count_chips(version, variant):
        return count
    return max(1, count // 2)


def chips_from_accelerator_type(accelerator_type: str | None) -> int | None:
    """Chips of this host from the slice name, for when /dev and sysfs show none: the
    slice's chips when the slice fits one host, else None (multi-host slices, unknown names)."""
    chips = slice_chips(accelerator_type)
    if not chips:
        return None
    match = re.match(r"^v(\d)([a-z]*)", (accelerator_type or "").strip().lower())
    assert match is not None   # slice_chips matched the same name
    per_host = 8 if _names_count_chips(int(match.group(1)), match.group(2)) else 4
    return chips if chips <= per_host else None


def _names_count_chips(version: int, variant: str) -> bool:
    return version >= 6 or variant in ("e", "litepod")


def stale_tpu_variables(environ: Mapping[str, str] | None = None) -> list[str]:
    """Variables to drop in the launcher child before xmp.spawn (the Kaggle workaround)."""
    env = os.environ if environ is None else environ
    return [k for k in STALE_TPU_VARIABLES if k in env]


def runtime_initialized() -> bool:
    """True when this process already started the XLA runtime (xm.xla_device(), a tensor on
    XLA, ...). Without torch_xla imported it cannot have started, so nothing is imported."""
    torch_xla = sys.modules.get("torch_xla")
    if torch_xla is None:
        return False
    xlac = getattr(torch_xla, "_XLAC", None)
    check = getattr(xlac, "_xla_runtime_is_initialized", None)
    if check is None:
        return False
    try:
        return bool(check())
    except Exception:   # why: a runtime that cannot be asked is taken as not started; a launch reports its own error
        log.debug("torch_xla's runtime check failed; assuming the runtime is not started", exc_info=True)
        return False


def describe(info: XlaInfo) -> str:
    """One line for messages: what was found and how."""
    what = f"TPU {info.accelerator_type}" if info.accelerator_type else (
        f"TPU v{info.tpu_version}" if info.tpu_version else "TPU")
    if not info.has_tpu:
        what = f"PJRT_DEVICE={info.pjrt_device}" if info.pjrt_device else "no TPU"
    found = "; ".join(info.evidence) or "nothing"
    where = {"colab": "Colab", "kaggle": "Kaggle"}.get(info.platform, "this machine")
    return f"{what} on {where} ({found})"


def _pci_tpu_chips(root: str) -> list[int]:
    """TPU generations of the Google TPU chips on PCI (sysfs), one entry per chip."""
    return [TPU_PCI_DEVICES[device] for _, device in pci.google_functions(root) if device in TPU_PCI_DEVICES]


def _numbered(root: str, pattern: str, real_machine: bool = False) -> list[str]:
    """The files ``pattern`` finds under ``root`` that end in a number; this machine's /dev kept a
    while (``pci.kept``), any other folder (a test's) read every time."""
    def read() -> list[str]:
        return [p for p in glob.glob(os.path.join(root, pattern)) if re.search(r"\d+$", p)]
    if real_machine and os.path.normpath(root) == "/dev":
        return list(pci.kept(f"/dev/{pattern}", read))
    return read()


def _read(path: str) -> str:
    with open(path, encoding="ascii", errors="replace") as f:
        return f.read().strip().lower()


def _positive_int(text: object, default: int) -> int:
    try:
        value = int(str(text).strip())
    except (TypeError, ValueError):
        return default
    return value if value > 0 else default


def _mesh_size(text: object) -> int | None:
    """'2,2,1' -> 4; None when unset or malformed."""
    try:
        dims = [int(d) for d in str(text).split(",")]
    except (TypeError, ValueError):
        return None
    if len(dims) != 3 or min(dims) < 1:
        return None
    return dims[0] * dims[1] * dims[2]


def resolve_num_ranks(num_processes: int | None, info: XlaInfo, environ: Mapping[str, str] | None = None) -> int:
    """How many ranks (XLA ordinals) to plan. On XLA, num_processes counts devices
    (8 on a v2-8/v3-8, as in torch_xla's "8 cores"), not processes; xmp.spawn
    only runs all of them (None) or one (1), so other values are refused."""
    device = info.device_type
    if device is None:
        raise LaunchArgumentError(
            "start_method='xla' found no TPU here and PJRT_DEVICE is not set. Switch to a TPU "
            "runtime, set PJRT_DEVICE=CPU to run torch_xla on the CPU, or leave start_method=None.")
    if device not in XLA_DEVICE_KINDS:
        raise LaunchArgumentError(
            f"PJRT_DEVICE={info.pjrt_device}: notebook_launch runs torch_xla on TPUs and on "
            f"PJRT_DEVICE=CPU only. For GPUs unset PJRT_DEVICE and use start_method='fork'.")
    layout = expected_layout(info, environ)
    if num_processes is None:
        if layout is None:
            raise LaunchArgumentError(
                f"num_processes=None: cannot tell how many TPU devices this machine has "
                f"({describe(info)}). Pass num_processes=<number of TPU devices> (8 on a v2-8 or "
                f"v3-8, 1 per chip from v4 on), or set TPU_ACCELERATOR_TYPE (e.g. v3-8).")
        return layout.ordinals
    if isinstance(num_processes, bool) or not isinstance(num_processes, int) or num_processes < 1:
        raise LaunchArgumentError(
            f"num_processes must be None (every XLA device) or a whole number >= 1; got {num_processes!r}")
    if num_processes == 1 or layout is None or num_processes == layout.ordinals:
        return num_processes   # an unknown layout is checked against torch_xla's own count in rank 0
    if layout.ordinals == 1:
        what = (f"this TPU has one XLA device ({describe(info)})" if device == "TPU" else
                "PJRT_DEVICE=CPU runs one XLA device here (CPU_NUM_DEVICES is 1 or unset)")
        raise LaunchArgumentError(
            f"num_processes={num_processes} does not fit this XLA machine: {what}, so torch_xla "
            f"runs one rank. Use num_processes=1 or None"
            + (f", or set CPU_NUM_DEVICES={num_processes} to run {num_processes}." if device == "CPU" else
               " (a bigger TPU, such as a v5e-8 or v3-8, runs 8)."))
    how = (f"{layout.processes} process(es) x {layout.threads_per_process} thread(s)"
           if device == "TPU" else f"CPU_NUM_DEVICES={layout.ordinals}")
    raise LaunchArgumentError(
        f"num_processes={num_processes} does not fit this XLA machine: torch_xla runs either every "
        f"device ({layout.ordinals} here: {how}) or one. Use num_processes=None or "
        f"{layout.ordinals} for all of them, or num_processes=1"
        + (", or set CPU_NUM_DEVICES to the number you want." if device == "CPU" else "."))


def xla_launch_info(start_method: StartMethod | None, environ: Mapping[str, str] | None = None, root: str = "/",
                    xla_installed: bool | None = None) -> XlaInfo | None:
    """The XlaInfo when this launch goes through torch_xla, else None.
    start_method=None picks XLA when ``wants_xla``; "xla" insists on it."""
    if start_method not in (None, "xla"):
        return None
    info = detect_xla(environ, root, xla_installed=xla_installed)
    if start_method == "xla" and not info.torch_xla_installed and xla_installed is None:
        pci.forget(_TORCH_XLA)   # installed since it was last looked for: not refused on a kept answer
        info = detect_xla(environ, root)
    if start_method == "xla" and not info.torch_xla_installed:
        raise LaunchArgumentError(
            "start_method='xla' needs torch_xla, which is not installed here. On a TPU VM, Colab or "
            "Kaggle TPU: pip install 'torch_xla[tpu]' matching your torch version; elsewhere use "
            "start_method='fork' or 'spawn'.")
    if start_method == "xla" or info.wants_xla:
        return info
    return None


def xla_note(info: XlaInfo, num_ranks: int, environ: Mapping[str, str] | None = None) -> str:
    """The launch summary's line about XLA: what was found and how ranks map to devices."""
    layout = expected_layout(info, environ)
    if num_ranks == 1:
        how = "1 rank on one device (xmp.spawn nprocs=1)"
    elif layout is not None and layout.ordinals == num_ranks:
        how = (f"{num_ranks} ranks = {layout.processes} process(es) x {layout.threads_per_process} "
               f"thread(s), one per device")
    else:
        how = f"{num_ranks} ranks, one per device"
    return f"XLA: {describe(info)}; {how}"
