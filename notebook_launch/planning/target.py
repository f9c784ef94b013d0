"""What a launch runs on here: the one decision ``notebook_launcher`` and
``notebook-launch env`` share, so the preview cannot disagree with the launch."""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Mapping

from .options import default_start_method, validate_num_processes
from ..wire.plan import DeviceKind, DistBackend, StartMethod, dist_backend_for
from ..detect.platform import Environment, Probe, cuda_gpus, detect, system_probe
from ..detect import torch_tpu as tpu
from ..detect.xla import XlaInfo, resolve_num_ranks, xla_launch_info, xla_note


@dataclass(frozen=True)
class LaunchTarget:
    """Where the ranks run: platform, device kind and count, how many ranks, how they start."""
    where: Environment
    device_kind: DeviceKind
    device_count: int                 # CUDA GPUs (0 unless device_kind is "cuda")
    num_processes: int
    start_method: StartMethod
    xla: XlaInfo | None = None
    notes: tuple[str, ...] = ()
    torch_tpu: tpu.TorchTpuInfo | None = None   # TorchTPU's devices, when device_kind is "tpu"

    @property
    def dist_backend(self) -> DistBackend:
        return dist_backend_for(self.device_kind)

    def gpus(self) -> tuple[tuple[str, str], ...]:
        """((name, driver), ...) of the GPUs the ranks use (nvidia-smi, only on CUDA)."""
        return cuda_gpus() if self.device_kind == "cuda" else ()


def launch_target(start_method: StartMethod | None = None, num_processes: int | None = None, *,
                  environ: Mapping[str, str] | None = None, probe: Probe | None = None,
                  root: str = "/", torch_tpu_version: str | None | bool = True) -> LaunchTarget:
    """Detect the machine and settle device kind, rank count and start method.
    TPU devices TorchTPU can drive, with torch_tpu installed, get one TorchTPU rank each, started
    by "spawn" (``detect.torch_tpu.wants_torch_tpu``; ``NOTEBOOK_LAUNCH_DEVICE`` asks for them or
    for CPU ranks); a TPU (or PJRT_DEVICE) with torch_xla goes through xmp.spawn, where
    num_processes counts XLA devices; otherwise one rank per CUDA GPU, else 1.
    ``torch_tpu_version``: the installed torch_tpu's (True: look; a test's fake machine says)."""
    if probe is None:   # the platform's TPU facts come from the same files the XLA decision reads
        probe = dataclasses.replace(system_probe(), tpu_root=root)
    env = os.environ if environ is None else environ
    where = detect(environ, probe)
    device_count = where.device_count if where.device_kind == "cuda" else 0
    if torch_tpu_version is True and tpu.requested_device(env) == "tpu":
        tpu.forget_version()   # TorchTPU asked for: its install looked for afresh, never refused on a kept answer
    torch_tpu = tpu.detect_torch_tpu(root, torch_tpu_version)
    if tpu.wants_torch_tpu(torch_tpu, start_method, env):
        ranks = tpu.resolve_num_ranks(num_processes, torch_tpu)
        return LaunchTarget(where, "tpu", 0, ranks, "spawn", notes=(tpu.note(torch_tpu, ranks),),
                            torch_tpu=torch_tpu)
    cpu_asked = tpu.requested_device(env) == "cpu" and start_method is None
    xla = None if cpu_asked else xla_launch_info(start_method, environ, root)
    if xla is not None:
        ranks = resolve_num_ranks(num_processes, xla, environ)
        return LaunchTarget(where, "xla", 0, ranks, "xla", xla, (xla_note(xla, ranks, environ),))
    device_kind: DeviceKind = "cuda" if device_count > 0 else "cpu"
    ranks = validate_num_processes(device_count or 1 if num_processes is None else num_processes,
                                   device_kind, device_count)
    notes: tuple[str, ...] = ()
    if torch_tpu.can_launch and start_method == "fork" and not cpu_asked:
        notes = (f"{device_kind.upper()} ranks: start_method='fork' cannot start TorchTPU ranks (torch_tpu "
                 f"refuses a TPU in a forked process); start_method=None or 'spawn' runs one per TPU device",)
    return LaunchTarget(where, device_kind, device_count, ranks, start_method or default_start_method(), notes=notes)
