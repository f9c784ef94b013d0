#!/usr/bin/env bash
# A fresh machine's first run: .venv with notebook_launch and what it needs at run time (torch, cloudpickle,
# rich, ipywidgets, ipython; no test tools), then a small real training on 2 CPU ranks
# (examples/train_cpu.py: DDP over gloo). Idempotent: a second run only trains.
# torch is pinned to the CPU build that pip finds on this project's machines; on your own machine
# any torch >= 2.8 works (install it first the way your machine needs it).
# scripts/setup.sh adds the test tools to the same .venv (scripts/test.sh runs it).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "torch==2.13.0"
bash scripts/pip-install.sh .venv/bin/python -e .
exec .venv/bin/python examples/train_cpu.py
