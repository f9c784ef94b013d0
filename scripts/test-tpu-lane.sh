#!/usr/bin/env bash
# The TorchTPU lane: builds .venv-tpu (scripts/setup-tpu.sh: torch 2.13.0 + torch_tpu 0.2.0 + libtpu, about
# 3 GB the first time, seconds after) and runs what works without a TPU chip: tests/tpu (import, detection,
# the ranks' environment against torch_tpu's own code, CPU launches beside torch_tpu, a TPU launch refused
# here) and the detection tests. The tests that need TPU devices skip here: scripts/test-tpu.sh runs them
# on a TPU VM. Run by scripts/test.sh (and so by .ci/run) after the main suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-tpu.sh
mkdir -p test-artifacts
# torch_tpu warns at every import that tcmalloc is not preloaded (host performance); that is not this lane's subject.
export PYTHONWARNINGS="${PYTHONWARNINGS:+$PYTHONWARNINGS,}ignore:<TorchTpu/Performance/TcMalloc/"
exec .venv-tpu/bin/python -m pytest -p no:cacheprovider tests/tpu tests/test_torch_tpu_detection.py "$@"
