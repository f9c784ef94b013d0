#!/usr/bin/env bash
# Create .venv with notebook_launch and its test tools. Idempotent.
# torch comes as scripts/quickstart.sh installs it (the version in scripts/torch-version.txt; the CPU build from
# PyTorch's index where no NVIDIA GPU is here, else what pip finds: on this project's machines, their CPU
# wheel), numpy beside it; a torch already in .venv is kept. Any torch >= 2.8 works (pyproject.toml's floor).
set -euo pipefail
cd "$(dirname "$0")/.."
NOTEBOOK_LAUNCH_VENV=.venv bash scripts/quickstart.sh --install
bash scripts/pip-install.sh .venv/bin/python -e ".[test]"
# jsonschema (imported by Ray, nbformat and jupyter_events) imports rfc3987-syntax where it is installed, and that
# builds some 35 Lark Earley parsers at import: 1.5 s of CPU in every process that imports jsonschema, each Ray
# worker among them, so each Ray rank's start (`import ray` took 2.2 s with it, 0.8 s without; a 4-rank launch on
# the tests' two-node cluster waited 3.4-6.0 s for its actors with it, 1.7-3.3 s without). jupyter-events'
# jsonschema[format-nongpl] brings it back with every install above; nothing these tests validate has an iri
# format, the one thing it checks. docs/guides/ray.md tells users the same for their nodes.
.venv/bin/python -m pip uninstall -y -q rfc3987-syntax || true
