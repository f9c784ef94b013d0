"""The CUDA lane (``bash scripts/test-gpu.sh``): real GPUs, real NCCL, real kernels.

Every test here is skipped, with the reason, where no CUDA device is visible (the CPU suite
collects them too). The pytest process itself never initializes CUDA: it is the "notebook"
that forks ranks, so scenarios that need CUDA initialized in the notebook run in a kernel.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from gpu_lane import SKIP_REASON, cuda_devices


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if SKIP_REASON is None:
        return
    marker = pytest.mark.skip(reason=f"GPU lane: {SKIP_REASON}")
    here = Path(__file__).resolve().parent
    for item in items:
        if here in Path(str(item.path)).resolve().parents:
            item.add_marker(marker)


@pytest.fixture
def gpus() -> int:
    return cuda_devices()
