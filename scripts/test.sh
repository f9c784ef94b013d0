#!/usr/bin/env bash
# Run the whole test suite on a fresh machine: system packages, .venv, pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/system-packages.sh
bash scripts/setup.sh
mkdir -p test-artifacts
# ipywidgets 7.7 lane (Colab's widget stack: ipywidgets 7.7.1, ipykernel 6.17): the widget panel
# and its Stop button in a real kernel. Full runs only (no pytest arguments); about 2 minutes,
# plus a few the first time the venv is built. Skip with NOTEBOOK_LAUNCH_SKIP_IPYW7=1.
if [ $# -eq 0 ] && [ -z "${NOTEBOOK_LAUNCH_SKIP_IPYW7:-}" ]; then
  bash scripts/setup-ipywidgets7.sh
  .venv-ipyw7/bin/python -m pytest -p no:cacheprovider tests/test_panel_notebook.py tests/test_stop_button.py
fi
# The main suite last, so its summary closes the log.
exec .venv/bin/python -m pytest -p no:cacheprovider "$@"
