#!/usr/bin/env bash
# Run the whole test suite on a fresh machine: system packages, the venvs, then three pytest lanes.
# With no arguments (CI, .ci/run): the ipywidgets 7.7 lane, the main suite, the torch_xla lane, then one
# total line over all lanes. With pytest arguments: the main suite only, with those arguments.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/system-packages.sh
bash scripts/setup.sh
mkdir -p test-artifacts
rm -f test-artifacts/junit-*.xml
if [ $# -gt 0 ]; then
  exec .venv/bin/python -m pytest -p no:cacheprovider "$@"
fi
status=0
# Static checks of notebook_launch/ (ruff and mypy, pinned in pyproject's test extra): zero findings.
.venv/bin/ruff check notebook_launch || status=1
.venv/bin/mypy || status=1
# ipywidgets 7.7 lane (Colab's widget stack: ipywidgets 7.7.1, ipykernel 6.17): the widget panel and its
# Stop button in a real kernel. About 2 minutes, plus a few the first time its venv is built.
# Skip with NOTEBOOK_LAUNCH_SKIP_IPYW7=1.
if [ -z "${NOTEBOOK_LAUNCH_SKIP_IPYW7:-}" ]; then
  bash scripts/setup-ipywidgets7.sh
  .venv-ipyw7/bin/python -m pytest -p no:cacheprovider --junitxml=test-artifacts/junit-ipyw7.xml \
    tests/test_panel_notebook.py tests/test_stop_button.py || status=1
fi
# The main suite.
.venv/bin/python -m pytest -p no:cacheprovider --junitxml=test-artifacts/junit-main.xml || status=1
# The torch_xla lane (the TPU backend on PJRT_DEVICE=CPU): scripts/test-xla.sh builds .venv-xla
# (torch 2.9.0 + torch_xla 2.9.0: 4-8 minutes the first time, seconds after), then about a minute of
# tests. A failed download fails the run. Skip with NOTEBOOK_LAUNCH_SKIP_XLA=1 (never in CI).
if [ -z "${NOTEBOOK_LAUNCH_SKIP_XLA:-}" ]; then
  bash scripts/test-xla.sh --junitxml=test-artifacts/junit-xla.xml || status=1
fi
.venv/bin/python scripts/junit_total.py test-artifacts/junit-*.xml || status=1
exit $status
