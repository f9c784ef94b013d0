#!/usr/bin/env bash
# Run the whole test suite on a fresh machine: system packages, .venv, pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/system-packages.sh
bash scripts/setup.sh
mkdir -p test-artifacts
exec .venv/bin/python -m pytest -p no:cacheprovider "$@"
