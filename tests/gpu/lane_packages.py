"""What the CUDA lane needs besides torch, as pip package -> importable module (they differ:
``ipython`` is imported as ``IPython``, ``pytest-timeout`` as ``pytest_timeout``).

scripts/test-gpu.sh asks this file (stdlib only: it runs before anything is installed):

    python tests/gpu/lane_packages.py all       # every package, for pip download
    python tests/gpu/lane_packages.py missing   # the packages whose module is not importable

tests/test_gpu_lane_packages.py checks the mapping against installed distributions.
"""
from __future__ import annotations

import importlib.util
import sys

PACKAGES: dict[str, str] = {
    "pytest": "pytest",
    "pytest-timeout": "pytest_timeout",
    "cloudpickle": "cloudpickle",
    "psutil": "psutil",
    "rich": "rich",
    "ipython": "IPython",
    "ipywidgets": "ipywidgets",
    "nbformat": "nbformat",
    "nbclient": "nbclient",
    "ipykernel": "ipykernel",
    "jupyter_client": "jupyter_client",
    # the GPU ranks' device memory in their rows (gpu_usage.py; tests/gpu/test_gpu_resources.py)
    "nvidia-ml-py": "pynvml",
}


def missing(packages: dict[str, str] = PACKAGES) -> list[str]:
    """The packages whose module cannot be found (found without importing it)."""
    gone = []
    for package, module in packages.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            gone.append(package)
    return gone


def main(argv: list[str]) -> int:
    if argv[1:] == ["all"]:
        print(" ".join(PACKAGES))
        return 0
    if argv[1:] == ["missing"]:
        print(" ".join(missing()))
        return 0
    print(f"usage: {argv[0]} all|missing", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
