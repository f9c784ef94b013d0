"""The CUDA lane's own checks, tested where no GPU is: scripts/test-gpu.sh's package ->
module mapping (tests/gpu/lane_packages.py), and what the NCCL test reads to know which
backend CUDA tensors use (tests/gpu/gpu_lane.py), against torch's behaviour here."""
from __future__ import annotations

import importlib.metadata
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "gpu"))
import gpu_lane  # noqa: E402
import lane_packages  # noqa: E402

from notebook_launch import notebook_launcher  # noqa: E402


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@pytest.mark.parametrize("package, module", sorted(lane_packages.PACKAGES.items()))
def test_each_package_provides_the_module_the_lane_looks_for(package, module):
    providers = importlib.metadata.packages_distributions().get(module, [])
    assert normalized(package) in [normalized(d) for d in providers], (
        f"{module!r} is provided by {providers}, not by the pip package {package!r}")


def test_missing_names_packages_by_their_module():
    fake = {"ipython": "IPython", "no-such-package-fake": "no_such_module_fake"}
    assert lane_packages.missing(fake) == ["no-such-package-fake"]
    assert lane_packages.missing({"ipython": "ipython"}) == ["ipython"]   # the bug: the module is IPython


def test_the_lane_script_takes_its_list_from_the_mapping():
    script = (ROOT / "scripts" / "test-gpu.sh").read_text()
    assert "tests/gpu/lane_packages.py all" in script and "tests/gpu/lane_packages.py missing" in script
    assert "find_spec" not in script and "NEEDED=(" not in script   # no second list, no guessed module names


def test_every_package_is_found_here(capsys):
    assert lane_packages.main(["lane_packages.py", "missing"]) == 0
    assert capsys.readouterr().out.strip() == ""
    assert lane_packages.main(["lane_packages.py", "all"]) == 0
    assert capsys.readouterr().out.split() == list(lane_packages.PACKAGES)


@pytest.mark.parametrize("config, backend", [
    ("cpu:gloo,cuda:nccl", "nccl"), ("cuda:nccl", "nccl"), ("cpu:gloo", None), ("nccl", "nccl")])
def test_cuda_backend_of_a_config(config, backend):
    assert gpu_lane.cuda_backend_of(config) == backend


def default_group_backend():
    import torch.distributed as dist
    dist.init_process_group()   # as the lane's NCCL test: no backend named
    try:
        # the ranks meet once before they end: one that ends right after init_process_group can make
        # its peer, still in gloo's connectFullMesh, fail under load (as in test_magic's bf16 launch)
        dist.barrier()
        return {"backend": str(dist.get_backend()), "config": dist.get_backend_config()}
    finally:
        dist.destroy_process_group()


def test_without_a_backend_torch_says_undefined_and_the_config_says_the_device_backend():
    """Why the lane reads get_backend_config(): init_process_group() without a backend gives
    get_backend() == "undefined" and maps the machine's accelerator (here the CPU) to its default."""
    import torch
    if torch.accelerator.is_available():
        pytest.skip("an accelerator is visible: the default group would use its backend")
    results = notebook_launcher(default_group_backend, num_processes=2, ui="none")
    assert [r["config"] for r in results] == ["cpu:gloo"] * 2
    assert [gpu_lane.cuda_backend_of(r["config"]) for r in results] == [None, None]
    assert [r["backend"] for r in results] == ["undefined"] * 2
