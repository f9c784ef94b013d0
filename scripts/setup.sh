#!/usr/bin/env bash
# Create .venv with notebook_launch and its test tools. Idempotent.
# torch comes as scripts/quickstart.sh installs it (the version in scripts/torch-version.txt; the CPU build from
# PyTorch's index where no NVIDIA GPU is here, else what pip finds: on this project's machines, their CPU
# wheel), numpy beside it; a torch already in .venv is kept. Any torch >= 2.8 works (pyproject.toml's floor).
set -euo pipefail
cd "$(dirname "$0")/.."
NOTEBOOK_LAUNCH_VENV=.venv bash scripts/quickstart.sh --install
bash scripts/pip-install.sh .venv/bin/python -e ".[test]"
