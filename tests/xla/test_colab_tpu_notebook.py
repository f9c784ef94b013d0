"""notebooks/colab_tpu.ipynb, run as it is in a real Jupyter kernel (nbclient).

There is no TPU here, so the kernel gets PJRT_DEVICE=CPU: the same torch_xla,
xmp.spawn and Accelerate code paths with one XLA CPU device standing in for the
TPU (one device keeps Accelerate's per-step all-reduce clear of CPU PJRT's
flaky multi-thread collectives; tests/xla/test_xla_backend.py covers two).
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers.kernel_ports import kernel_manager_class

pytest.importorskip("torch_xla", reason="torch_xla is not installed: run bash scripts/test-xla.sh")
nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "colab_tpu.ipynb"


def cell_text(cell) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            parts.append(out["text"])
        elif "data" in out and "text/plain" in out["data"]:
            parts.append(out["data"]["text/plain"])
    return "".join(parts)


def test_colab_tpu_notebook_runs_as_it_is(tmp_path, monkeypatch):
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    monkeypatch.setenv("CPU_NUM_DEVICES", "1")
    monkeypatch.setenv("NOTEBOOK_LAUNCH_NO_INSTALL", "1")   # everything the notebook needs is in this venv
    monkeypatch.setenv("NOTEBOOK_LAUNCH_LOG_DIR", str(tmp_path / "runs"))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     kernel_manager_class=kernel_manager_class(),   # ports: helpers.kernel_ports
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()   # raises CellExecutionError if any cell fails
    code = [c for c in nb.cells if c.cell_type == "code"]
    text = [cell_text(c) for c in code]
    assert "hardware: PJRT_DEVICE=CPU" in text[0] and "installed now: nothing" in text[0]
    assert "PJRT_DEVICE=CPU" in text[1] and "xmp.spawn will run 1 replica(s)" in text[1]
    assert "[rank 0] epoch 7: loss" in text[3]
    assert "0 of 1 xla:0 XLA" in text[3]
    assert "all 1 replicas agree" in text[4]
    assert "rank 0 failed: RuntimeError: this replica ran out of data" in text[5]
    assert 'raise RuntimeError("this replica ran out of data")' in text[5]
    assert "failed replica: 0" in text[5]
    assert os.environ.get("PJRT_DEVICE") == "CPU"
