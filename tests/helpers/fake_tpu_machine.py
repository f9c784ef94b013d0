"""FAKE TPU machines for detection tests: a folder standing in for ``/`` with the sysfs and /dev
entries a TPU VM shows (there is no TPU chip here). What TorchTPU counts (torch_tpu 0.2.0's
``hardware._scan_pci_tpus``): Google PCI functions (vendor 0x1ae0) whose ``iommu_group`` link names
a group that is a file in /dev/vfio; TPU v2-v4 VMs show /dev/accel<N> as well."""
from __future__ import annotations

import os
from pathlib import Path

# PCI device ids (torch_tpu's hardware tables; 0x0027 is TPU v2/v3, which TorchTPU does not drive)
V3, V4, V5P, V5E, V6E, V7 = "0x0027", "0x005e", "0x0062", "0x0063", "0x006f", "0x0076"


def fake_tpu_root(tmp_path: Path, device_id: str | None = None, chips: int = 0, *, vfio: bool = True,
                  accel: int = 0, other_pci: tuple[tuple[str, str], ...] = ()) -> str:
    """A FAKE ``/``: ``chips`` Google PCI functions of ``device_id``, each in an IOMMU group that is
    a file in /dev/vfio when ``vfio``; ``accel`` /dev/accelN files; ``other_pci`` (vendor, device)."""
    root = tmp_path / f"fake-tpu-root{len(list(tmp_path.glob('fake-tpu-root*')))}"
    (root / "dev/vfio").mkdir(parents=True)
    (root / "dev/vfio/vfio").write_text("")
    (root / "sys/kernel/iommu_groups").mkdir(parents=True)
    entries = [("0x1ae0", device_id)] * chips + list(other_pci)
    for i, (vendor, device) in enumerate(entries):
        d = root / "sys/bus/pci/devices" / f"0000:00:{i + 4:02x}.0"
        d.mkdir(parents=True)
        (d / "vendor").write_text(vendor + "\n")
        (d / "device").write_text(f"{device}\n")
        group = str(10 + i)
        (root / "sys/kernel/iommu_groups" / group).mkdir()
        os.symlink(f"../../../../kernel/iommu_groups/{group}", d / "iommu_group")
        if vfio and vendor == "0x1ae0":
            (root / "dev/vfio" / group).write_text("")
    for i in range(accel):
        (root / f"dev/accel{i}").write_text("")
    return str(root)
