"""TorchTPU ranks on real TPU devices: run by scripts/test-tpu.sh on a TPU VM (v4 or newer) with
.venv-tpu; skipped where TorchTPU has no device (the CI lane). NOT YET RUN ON A CHIP: written to
torch_tpu 0.2.0's contract (detect/torch_tpu.py) and checked there only up to the launch."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch_tpu", reason="torch_tpu is not installed: bash scripts/test-tpu.sh")
import torch  # noqa: E402

from notebook_launch import LaunchError, notebook_launcher  # noqa: E402
from notebook_launch.detect import torch_tpu  # noqa: E402

HERE = torch_tpu.detect_torch_tpu("/")
pytestmark = pytest.mark.skipif(not HERE.can_launch, reason=f"no TPU device here: {HERE.describe()}")


def all_reduce_on_tpu():
    import torch as t
    import torch.distributed as dist
    rank = int(os.environ["RANK"])
    dist.init_process_group("tpu")
    x = t.ones(2, device="tpu") * (rank + 1)
    dist.all_reduce(x)
    t.tpu.synchronize()  # type: ignore[attr-defined]  # torch_tpu's module
    dist.destroy_process_group()
    return {"rank": rank, "sum": x, "local_rank": int(os.environ["LOCAL_RANK"])}


def test_one_rank_per_device_and_results_on_the_cpu(tmp_path):
    results = notebook_launcher(all_reduce_on_tpu, ui="none", log_dir=str(tmp_path / "logs"), timeout=600)
    n = HERE.devices
    assert [r["rank"] for r in results] == list(range(n)) == [r["local_rank"] for r in results]
    expected = torch.full((2,), float(n * (n + 1) // 2))
    assert all(r["sum"].device.type == "cpu" and torch.equal(r["sum"], expected) for r in results)


def test_a_second_launch_gets_the_devices_back(tmp_path):
    for attempt in range(2):
        assert len(notebook_launcher(all_reduce_on_tpu, ui="none", log_dir=str(tmp_path / f"logs{attempt}"),
                                     timeout=600)) == HERE.devices


def fails_on_rank_1():
    import torch as t
    x = t.ones(1, device="tpu")
    if os.environ["RANK"] == "1":
        raise ValueError("rank 1 fails on purpose")
    return x.cpu().item()


def test_a_failing_rank_is_named(tmp_path):
    if HERE.devices < 2:
        pytest.skip("one TPU device")
    with pytest.raises(LaunchError, match="rank 1") as err:
        notebook_launcher(fails_on_rank_1, num_processes=min(n for n in HERE.topologies if n >= 2),
                          ui="none", log_dir=str(tmp_path / "logs"), timeout=600)
    assert "on purpose" in str(err.value)


def test_a_notebook_that_started_the_runtime_is_refused():
    code = textwrap.dedent("""
        import torch
        from notebook_launch import GuardError, notebook_launcher
        torch.ones(1, device="tpu") + 1   # the runtime starts in this "notebook"
        try:
            notebook_launcher(print, args=("never",), ui="none")
        except GuardError as exc:
            print("REFUSED", "restart the kernel" in str(exc))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600).stdout
    assert "REFUSED True" in out
