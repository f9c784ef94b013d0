#!/usr/bin/env bash
# TorchTPU ranks on real TPU devices: run this on a TPU VM (v4 or newer: v4, v5e, v5p, v6e, TPU7x) in a
# clone. It builds .venv-tpu (scripts/setup-tpu.sh), checks that TorchTPU sees devices here (else it stops,
# saying what it found), then runs tests/tpu with nothing skipped: one rank per device with an all-reduce,
# results moved to the CPU, a second launch, a failing rank, and the guard against a notebook that already
# started TorchTPU's runtime. CI has no TPU: its lane (scripts/test-tpu-lane.sh) runs the rest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-tpu.sh
export PYTHONWARNINGS="${PYTHONWARNINGS:+$PYTHONWARNINGS,}ignore:<TorchTpu/Performance/TcMalloc/"
PYTHONPATH=$PWD .venv-tpu/bin/python - <<'PY'
import sys
from notebook_launch.detect.torch_tpu import detect_torch_tpu
info = detect_torch_tpu("/")
print(f"test-tpu: {info.describe()}", file=sys.stderr)
if not info.can_launch:
    sys.exit("test-tpu: no TPU device TorchTPU can use here; run this on a TPU VM (v4 or newer)")
PY
mkdir -p test-artifacts
exec .venv-tpu/bin/python -m pytest -p no:cacheprovider -rs tests/tpu "$@"
