"""Each GPU rank's row shows its device's memory, read through the real NVML (issue 34 items 1
and 5): the CPU suite checks the same row with a fake NVML (tests/test_resources.py), since no GPU
can exist there. The pytest process is the "notebook": it must not initialize CUDA, and does not
(NVML is not the CUDA runtime).

Run with ``bash scripts/test-gpu.sh -k resources`` on a GPU machine (nvidia-ml-py is one of the
lane's packages, tests/gpu/lane_packages.py)."""
from __future__ import annotations

import os
import pathlib
import time

import pytest

from helpers.panel_helpers import KeepStateDisplay

from notebook_launch import notebook_launcher
from notebook_launch.display import format as fmt

HELD = 512 << 20   # what each rank allocates on its device
WAIT = 120.0


def hold_device_memory(sentinel: str) -> bool:
    """Allocate HELD bytes on this rank's device, hold them until the notebook saw them."""
    import torch
    block = torch.ones(HELD // 4, dtype=torch.float32, device="cuda")
    torch.cuda.synchronize()
    deadline = time.monotonic() + WAIT
    while not os.path.exists(f"{sentinel}.{os.environ['LOCAL_RANK']}") and time.monotonic() < deadline:
        time.sleep(0.05)
    del block
    return os.path.exists(f"{sentinel}.{os.environ['LOCAL_RANK']}")


class SeeingDisplay(KeepStateDisplay):
    """Writes ``sentinel.<local rank>`` once that rank's row shows its device holding HELD bytes,
    keeping the row's text at that moment."""

    def __init__(self, sentinel: str) -> None:
        super().__init__()
        self.sentinel = sentinel
        self.rows: dict[int, str] = {}

    def refresh(self, state) -> None:
        for rs in state.ranks:
            gpu = rs.resources.gpu if rs.resources is not None else None
            if rs.local_rank not in self.rows and gpu is not None and gpu.used >= HELD:
                self.rows[rs.local_rank] = fmt.rank_line(rs)
                pathlib.Path(f"{self.sentinel}.{rs.local_rank}").touch()


def test_a_gpu_ranks_row_shows_its_device_memory_from_nvml(gpus, tmp_path, log_dir):
    pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed (scripts/test-gpu.sh installs it)")
    import torch
    display = SeeingDisplay(str(tmp_path / "seen"))
    results = notebook_launcher(hold_device_memory, args=(str(tmp_path / "seen"),), num_processes=gpus,
                                log_dir=log_dir, ui=display)
    assert results == [True] * gpus, f"the notebook never saw a rank's device memory: {display.rows}"
    for local in range(gpus):
        row = display.rows[local]
        assert "GPU " in row and " of " in row and "GiB" in row, row
    assert display.state is not None
    for rs in display.state.ranks:   # the process's own share, where the driver lists it here
        assert rs.resources is not None, rs
        gpu = rs.resources.gpu
        assert gpu is not None and gpu.total > gpu.used >= HELD
        assert gpu.process_used is None or gpu.process_used >= HELD
    assert "GPU " in fmt.summary(display.state)
    assert "GPU " in pathlib.Path(log_dir, "rank0.log").read_text()
    assert not torch.cuda.is_initialized(), "sampling must not initialize CUDA in the notebook"
