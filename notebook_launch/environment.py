"""Where we run and which devices exist, found without initializing CUDA or XLA."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
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
