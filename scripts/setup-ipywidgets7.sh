#!/usr/bin/env bash
# A second venv, .venv-ipyw7, with Colab's widget stack (ipywidgets 7.7.1, ipykernel 6.17),
# to test the widget panel against ipywidgets 7 (tests/test_panel_notebook.py). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv-ipyw7/bin/python ]; then
  "$PY" -m venv .venv-ipyw7
fi
.venv-ipyw7/bin/python -m pip install -q --upgrade pip
.venv-ipyw7/bin/python -m pip install -q "torch==2.13.0"
bash scripts/pip-install.sh .venv-ipyw7/bin/python -e . "ipywidgets==7.7.1" "ipykernel==6.17.1" \
  "jupyterlab_widgets<2" "widgetsnbextension<4" "pytest>=8" "pytest-timeout>=2.3" \
  "nbclient>=0.10" "nbformat>=5.9" "jupyter_client>=7" "tqdm>=4.66" "psutil>=5.9" "cloudpickle>=2.2"
