#!/usr/bin/env bash
# Create .venv with notebook_launch and its test tools. Idempotent.
# torch is pinned to the CPU build that pip finds on this project's machines;
# on your own machine any torch >= 2.8 works (pyproject.toml's floor; then `pip install .` in a clone).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "torch==2.13.0"
bash scripts/pip-install.sh .venv/bin/python -e ".[test]"
