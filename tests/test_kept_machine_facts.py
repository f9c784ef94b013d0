"""What the TPU detection keeps a while (``detect.pci.kept``, issue 45): this machine's /dev files and
whether torch_xla is installed are looked for once every ``FRESH_FOR`` seconds, not twice per launch;
a launch that would be refused on a kept answer looks again first."""
from __future__ import annotations

import pytest

from notebook_launch.detect import pci, xla


@pytest.fixture
def fresh(monkeypatch):
    """No kept answers before or after the test (another test's would be taken for this one's)."""
    monkeypatch.setattr(pci, "_kept", {})
    return pci


def test_an_answer_is_kept_until_forgotten(fresh):
    reads: list[int] = []

    def read() -> int:
        reads.append(1)
        return len(reads)

    assert fresh.kept("fact", read) == 1
    assert fresh.kept("fact", read) == 1   # kept: not read again
    fresh.forget("fact")
    assert fresh.kept("fact", read) == 2


def test_an_xla_launch_is_not_refused_on_a_kept_answer(fresh, monkeypatch, tmp_path):
    """torch_xla installed since the last launch looked (pip install in the notebook): start_method='xla'
    looks again before it says torch_xla is missing."""
    installed = [False]
    monkeypatch.setattr(xla, "_find_torch_xla", lambda: installed[0])
    env, machine = {"PJRT_DEVICE": "CPU"}, str(tmp_path)   # a machine with no TPU files
    assert xla.xla_launch_info(None, env, root=machine) is None   # not installed: kept as such
    installed[0] = True
    assert xla.torch_xla_installed() is False   # the kept answer, within FRESH_FOR
    info = xla.xla_launch_info("xla", env, root=machine)
    assert info is not None and info.torch_xla_installed


def test_a_folder_other_than_this_machines_dev_is_read_every_time(fresh, tmp_path):
    (tmp_path / "accel0").touch()
    assert xla.count_tpu_device_files(str(tmp_path)) == 1
    (tmp_path / "accel1").touch()
    assert xla.count_tpu_device_files(str(tmp_path)) == 2
