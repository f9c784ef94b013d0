#!/usr/bin/env bash
# The real torch_xla lane: builds .venv-xla (scripts/setup-xla.sh: torch 2.9.0 +
# torch_xla 2.9.0, about 7 GB and 8 minutes the first time, seconds after) and runs
# the XLA tests on PJRT_DEVICE=CPU (two ordinals as two threads of one process).
# Run by scripts/test.sh (and so by .ci/run) after the main suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-xla.sh
mkdir -p test-artifacts
exec .venv-xla/bin/python -m pytest -p no:cacheprovider tests/xla tests/test_xla_detection.py "$@"
