"""Where we run and which devices exist, found without initializing CUDA or XLA."""
from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Mapping

from ..notebook import cuda_tracking
from ..errors.ipython_shell import running_shell
from ..wire.plan import DeviceKind
from .hosted import hosted_service
from .xla import XlaInfo, detect_xla, torch_xla_installed

log = logging.getLogger("notebook_launch")


def cuda_device_count() -> int:
    """GPUs visible to this process, counted without poisoning fork: NVML, never the CUDA
    runtime in this process (``torch.cuda.device_count()`` falls back to the runtime when NVML
    fails; see ``cuda_tracking.count_gpus_without_poisoning``)."""
    return cuda_tracking.count_gpus_without_poisoning()


@lru_cache(maxsize=1)
def cuda_gpus() -> tuple[tuple[str, str], ...]:
    """((name, driver_version), ...) from nvidia-smi, which runs in its own process."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return ()
    try:
        out = subprocess.run([exe, "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        log.debug("nvidia-smi failed; GPU names unknown", exc_info=True)
        return ()
    rows = []
    for line in out.strip().splitlines():
        name, _, driver = line.partition(",")
        rows.append((name.strip(), driver.strip()))
    return tuple(rows)


START_PROCESS_SWITCH = "NOTEBOOK_LAUNCH_START_PROCESS"     # "0": no start process; ranks start as fresh Pythons


def start_process_possible(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether launches that must not fork the notebook can start their ranks from the warm start
    process (``engines.local.start_process``): Linux (pidfds, fds passed over a socket), not
    switched off. A fact of this machine, here so that planning asks it without importing the
    engine that runs the process."""
    if environ.get(START_PROCESS_SWITCH, "").strip().lower() in ("0", "false", "no", "off"):
        return False
    return sys.platform.startswith("linux") and hasattr(os, "pidfd_open") and hasattr(socket, "send_fds")


def in_ipython_kernel() -> bool:
    """True inside a Jupyter kernel (as opposed to a terminal IPython or a script)."""
    shell = _ipython_shell()
    return shell is not None and getattr(shell, "kernel", None) is not None


def inside_launched_rank() -> bool:
    return "NOTEBOOK_LAUNCH_RANK" in os.environ


# --- where we run: one answer for the launcher, the displays and `notebook-launch env` -----

PLATFORMS = ("colab-gpu", "colab-tpu", "colab-cpu", "kaggle-gpu", "kaggle-tpu", "kaggle-cpu",
             "jupyterlab", "notebook", "vscode", "ipython-terminal", "script")


@dataclass(frozen=True)
class Probe:
    """Facts about the process that are not environment variables. ``system_probe()``
    reads the real ones; tests build fixtures (a fake GPU or TPU says so in its name)."""
    shell_class: str | None = None   # "ipykernel.zmqshell.ZMQInteractiveShell", ... or None
    in_kernel: bool = False          # the IPython shell belongs to a Jupyter kernel
    cuda_count: int = 0
    gpu_names: tuple[str, ...] = ()
    tpu_root: str | None = None      # where the TPU probe (xla.detect_xla) reads sysfs and /dev:
                                     # "/" here; a test's fake root with fake chip files; None: no files
    torch_xla_installed: bool = False
    server_cmdline: str = ""         # command line of the process that started the kernel
    modules: frozenset[str] = frozenset()  # relevant modules already imported (google.colab, ...)


@dataclass(frozen=True)
class Environment:
    """Where we run and which devices exist. ``device_count`` counts devices of
    ``device_kind`` (CUDA GPUs or TPU chips; 0 on CPU)."""
    platform: str
    device_kind: DeviceKind
    device_count: int
    gpu_names: tuple[str, ...] = ()
    has_tpu: bool = False
    tpu: XlaInfo | None = None        # the TPU probe's answer (xla.detect_xla), when it found a TPU
    frontend: str = "script"          # "notebook" (a Jupyter kernel), "terminal" or "script"
    evidence: tuple[str, ...] = ()              # why we think so, for the launch line and bug reports

    @property
    def hosted(self) -> str | None:
        """"colab", "kaggle" or None."""
        head = self.platform.split("-")[0]
        return head if head in ("colab", "kaggle") else None

    def describe(self) -> str:
        if self.device_kind == "cuda":
            names = sorted(set(self.gpu_names))
            what = f"{self.device_count} CUDA GPU(s)" + (f" ({', '.join(names)})" if names else "")
        elif self.device_kind == "xla":
            name = f"TPU {self.tpu.accelerator_type}" if self.tpu and self.tpu.accelerator_type else "TPU"
            if self.device_count:
                what = f"{name} ({self.device_count} chip(s))"
            elif self.tpu and self.tpu.slice_chips:
                what = f"{name} ({self.tpu.slice_chips} chip(s) in the slice; this host's share unknown)"
            else:
                what = name
        else:
            what = "CPU only"
        return f"{self.platform}: {what}"


def detect(environ: Mapping[str, str] | None = None, probe: Probe | None = None) -> Environment:
    """Classify where we run from environment variables and ``probe`` (default: the real
    process). Never initializes CUDA or XLA. The TPU facts are the TPU probe's
    (``xla.detect_xla``), so this and the XLA launch path cannot disagree."""
    env = os.environ if environ is None else environ
    probe = system_probe() if probe is None else probe
    evidence: list[str] = []

    tpu = detect_xla(env, probe.tpu_root, modules=probe.modules, xla_installed=probe.torch_xla_installed)
    has_tpu = tpu.has_tpu
    if has_tpu:
        evidence += tpu.evidence

    device_kind: DeviceKind
    if probe.cuda_count > 0:
        device_kind, device_count = "cuda", probe.cuda_count
        evidence.append(f"{probe.cuda_count} CUDA device(s)")
    elif has_tpu:
        device_kind, device_count = "xla", tpu.local_chips
    else:
        device_kind, device_count = "cpu", 0

    if probe.in_kernel:
        frontend = "notebook"
    elif probe.shell_class:
        frontend = "terminal"
    else:
        frontend = "script"

    hosted, why = hosted_service(env, probe.modules, probe.shell_class)
    if hosted:
        evidence.append(why)
        suffix = {"xla": "tpu", "cuda": "gpu", "cpu": "cpu"}[device_kind]
        platform = f"{hosted}-{suffix}"
    elif frontend == "notebook":
        platform = _notebook_frontend(env, probe, evidence)
    elif frontend == "terminal":
        platform = "ipython-terminal"
        evidence.append(f"IPython shell {probe.shell_class}")
    else:
        platform = "script"
        evidence.append("no IPython shell")
    return Environment(platform=platform, device_kind=device_kind, device_count=device_count,
                       gpu_names=tuple(probe.gpu_names) if device_kind == "cuda" else (),
                       has_tpu=has_tpu, tpu=tpu if has_tpu else None, frontend=frontend,
                       evidence=tuple(evidence))


def _notebook_frontend(env: Mapping[str, str], probe: Probe, evidence: list[str]) -> str:
    """Which frontend drives this kernel: the server's command line says lab or notebook;
    VS Code starts kernels with its own variables."""
    cmd = probe.server_cmdline.lower()
    if "jupyter-lab" in cmd or "jupyterlab" in cmd or "jupyter lab" in cmd:
        evidence.append("kernel started by jupyter lab")
        return "jupyterlab"
    if any(word in cmd for word in ("jupyter-notebook", "jupyter notebook", "nbclassic")):
        evidence.append("kernel started by jupyter notebook")
        return "notebook"
    vscode_keys = [k for k in ("VSCODE_PID", "VSCODE_CWD", "VSCODE_IPC_HOOK_CLI",
                               "PYDEVD_IPYTHON_COMPATIBLE_DEBUGGING") if k in env]
    if vscode_keys or "vscode" in cmd:
        evidence.append("VS Code: " + (", ".join(f"${k}" for k in vscode_keys) or "kernel parent"))
        return "vscode"
    evidence.append("Jupyter kernel, frontend unknown")
    return "notebook"


def system_probe() -> Probe:
    """The real process: IPython shell, CUDA count (NVML, no context), this machine's
    files for the TPU probe."""
    shell = _ipython_shell()
    shell_class = f"{type(shell).__module__}.{type(shell).__qualname__}" if shell is not None else None
    in_kernel = shell is not None and getattr(shell, "kernel", None) is not None
    cuda_count = cuda_device_count()
    gpu_names = tuple(name for name, _ in cuda_gpus()) if cuda_count else ()
    modules = frozenset(m for m in ("google.colab", "kaggle_secrets", "torch_xla") if m in sys.modules)
    return Probe(shell_class=shell_class, in_kernel=in_kernel, cuda_count=cuda_count,
                 gpu_names=gpu_names, tpu_root="/", torch_xla_installed=torch_xla_installed(),
                 server_cmdline=_kernel_parent_cmdline() if in_kernel else "", modules=modules)


def _ipython_shell() -> Any:
    return running_shell()


def _kernel_parent_cmdline() -> str:
    pid = os.environ.get("JPY_PARENT_PID") or str(os.getppid())
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        log.debug("cannot read the kernel parent's command line", exc_info=True)
        return ""
