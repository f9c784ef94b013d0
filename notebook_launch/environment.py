"""Where we run and which devices exist, found without initializing CUDA or XLA."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from functools import lru_cache


def cuda_device_count() -> int:
    """GPUs visible to this process. torch asks NVML, which does not poison fork."""
    try:
        import torch
    except ImportError:
        return 0
    try:
        return int(torch.cuda.device_count())
    except Exception:
        return 0


@lru_cache(maxsize=1)
def cuda_gpus() -> tuple:
    """((name, driver_version), ...) from nvidia-smi, which runs in its own process."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return ()
    try:
        out = subprocess.run([exe, "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    rows = []
    for line in out.strip().splitlines():
        name, _, driver = line.partition(",")
        rows.append((name.strip(), driver.strip()))
    return tuple(rows)


def in_ipython_kernel() -> bool:
    """True inside a Jupyter kernel (as opposed to a terminal IPython or a script)."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    try:
        shell = ipython.get_ipython()
    except Exception:
        return False
    return shell is not None and getattr(shell, "kernel", None) is not None


def inside_launched_rank() -> bool:
    return "NOTEBOOK_LAUNCH_RANK" in os.environ


# --- where we run: one answer for the launcher, the displays and the TPU backend -----------

PLATFORMS = ("colab-gpu", "colab-tpu", "colab-cpu", "kaggle-gpu", "kaggle-tpu", "kaggle-cpu",
             "jupyterlab", "notebook", "vscode", "ipython-terminal", "script")
TPU_ENV_KEYS = ("COLAB_TPU_ADDR", "TPU_NAME", "TPU_ACCELERATOR_TYPE", "XRT_TPU_CONFIG")


@dataclass(frozen=True)
class Probe:
    """Facts about the process that are not environment variables. ``system_probe()``
    reads the real ones; tests build fixtures (a fake GPU or TPU says so in its name)."""
    shell_class: str | None = None   # "ipykernel.zmqshell.ZMQInteractiveShell", ... or None
    in_kernel: bool = False          # the IPython shell belongs to a Jupyter kernel
    cuda_count: int = 0
    gpu_names: tuple = ()
    tpu_chips: int = 0               # /dev/accel* (TPU v2-v4) or /dev/vfio/<n> (v5e, v6e)
    server_cmdline: str = ""         # command line of the process that started the kernel
    modules: frozenset = frozenset()  # relevant modules already imported (google.colab, ...)


@dataclass(frozen=True)
class Environment:
    """Where we run and which devices exist. ``device_count`` counts devices of
    ``device_kind`` (CUDA GPUs or TPU chips; 0 on CPU)."""
    platform: str
    device_kind: str                  # "cpu", "cuda" or "xla"
    device_count: int
    gpu_names: tuple = ()
    has_tpu: bool = False
    frontend: str = "script"          # "notebook" (a Jupyter kernel), "terminal" or "script"
    evidence: tuple = ()              # why we think so, for the launch line and bug reports

    @property
    def hosted(self) -> str | None:
        """"colab", "kaggle" or None."""
        head = self.platform.split("-")[0]
        return head if head in ("colab", "kaggle") else None

    @property
    def in_notebook(self) -> bool:
        return self.frontend == "notebook"

    def describe(self) -> str:
        if self.device_kind == "cuda":
            names = sorted(set(self.gpu_names))
            what = f"{self.device_count} CUDA GPU(s)" + (f" ({', '.join(names)})" if names else "")
        elif self.device_kind == "xla":
            what = f"TPU ({self.device_count} chip(s))" if self.device_count else "TPU"
        else:
            what = "CPU only"
        return f"{self.platform}: {what}"


def detect(environ=None, probe: Probe | None = None) -> Environment:
    """Classify where we run from environment variables and ``probe`` (default: the real
    process). Never initializes CUDA or XLA."""
    env = os.environ if environ is None else environ
    probe = system_probe() if probe is None else probe
    evidence = []

    tpu_env = [k for k in TPU_ENV_KEYS if env.get(k)]
    if env.get("PJRT_DEVICE", "").upper() == "TPU":
        tpu_env.append("PJRT_DEVICE=TPU")
    has_tpu = probe.tpu_chips > 0 or bool(tpu_env)
    if probe.tpu_chips:
        evidence.append(f"{probe.tpu_chips} TPU device file(s)")
    evidence += [f"${k}" for k in tpu_env]

    if probe.cuda_count > 0:
        device_kind, device_count = "cuda", probe.cuda_count
        evidence.append(f"{probe.cuda_count} CUDA device(s)")
    elif has_tpu:
        device_kind = "xla"
        device_count = probe.tpu_chips or tpu_chips_from_type(env.get("TPU_ACCELERATOR_TYPE", ""))
    else:
        device_kind, device_count = "cpu", 0

    if probe.in_kernel:
        frontend = "notebook"
    elif probe.shell_class:
        frontend = "terminal"
    else:
        frontend = "script"

    hosted = _hosted(env, probe, evidence)
    if hosted:
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
                       has_tpu=has_tpu, frontend=frontend, evidence=tuple(evidence))


def _hosted(env, probe, evidence) -> str | None:
    colab_keys = [k for k in ("COLAB_RELEASE_TAG", "COLAB_GPU", "COLAB_BACKEND_VERSION") if k in env]
    if colab_keys or "google.colab" in probe.modules or "google.colab" in (probe.shell_class or ""):
        evidence.append("Colab: " + (", ".join(f"${k}" for k in colab_keys) or "google.colab"))
        return "colab"
    kaggle_keys = [k for k in ("KAGGLE_KERNEL_RUN_TYPE", "KAGGLE_URL_BASE", "KAGGLE_DATA_PROXY_URL")
                   if k in env]
    if kaggle_keys:
        evidence.append("Kaggle: " + ", ".join(f"${k}" for k in kaggle_keys))
        return "kaggle"
    return None


def _notebook_frontend(env, probe, evidence) -> str:
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


def tpu_chips_from_type(accelerator_type: str) -> int:
    """Chips in a TPU slice name: "v3-8" counts TensorCores (2 per chip), "v5litepod-8"/"v6e-8" chips."""
    kind, _, size = accelerator_type.strip().lower().rpartition("-")
    if not size.isdigit():
        return 0
    n = int(size)
    return n if kind.startswith(("v5lite", "v5e", "v6e")) else max(1, n // 2)


def system_probe() -> Probe:
    """The real process: IPython shell, CUDA count (NVML, no context), TPU device files."""
    shell = _ipython_shell()
    shell_class = f"{type(shell).__module__}.{type(shell).__qualname__}" if shell is not None else None
    in_kernel = shell is not None and getattr(shell, "kernel", None) is not None
    cuda_count = cuda_device_count()
    gpu_names = tuple(name for name, _ in cuda_gpus()) if cuda_count else ()
    modules = frozenset(m for m in ("google.colab", "kaggle_secrets", "torch_xla") if m in sys.modules)
    return Probe(shell_class=shell_class, in_kernel=in_kernel, cuda_count=cuda_count,
                 gpu_names=gpu_names, tpu_chips=count_tpu_device_files(),
                 server_cmdline=_kernel_parent_cmdline() if in_kernel else "", modules=modules)


def count_tpu_device_files(dev: str = "/dev") -> int:
    try:
        accel = [n for n in os.listdir(dev) if n.startswith("accel") and n[5:].isdigit()]
    except OSError:
        accel = []
    if accel:
        return len(accel)
    try:  # v5e/v6e expose chips as numbered VFIO groups (only on TPU VMs)
        vfio = [n for n in os.listdir(os.path.join(dev, "vfio")) if n.isdigit()]
    except OSError:
        vfio = []
    return len(vfio) if vfio and _tpu_vm() else 0


def _tpu_vm() -> bool:
    """Numbered VFIO groups also exist on GPU passthrough hosts: only count them next to libtpu."""
    if any(k.startswith("TPU_") for k in os.environ):
        return True
    if any(os.path.exists(p) for p in ("/lib/libtpu.so", "/usr/lib/libtpu.so")):
        return True
    try:  # pip's libtpu wheel; find_spec does not import it
        import importlib.util
        return importlib.util.find_spec("libtpu") is not None
    except (ImportError, ValueError):
        return False


def _ipython_shell():
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return None
    try:
        return ipython.get_ipython()
    except Exception:
        return None


def _kernel_parent_cmdline() -> str:
    pid = os.environ.get("JPY_PARENT_PID") or str(os.getppid())
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""
