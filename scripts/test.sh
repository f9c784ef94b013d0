#!/usr/bin/env bash
# Run the whole test suite on a fresh machine: system packages, the venvs, then four pytest lanes.
# With no arguments (CI, .ci/run): the main suite, the Colab lane, the Kaggle lane, the torch_xla lane, then
# one total line over all lanes. With pytest arguments: the main suite only, with those arguments.
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
# Static checks of the whole repository (ruff and mypy, pinned in pyproject's test extra): zero findings. The
# same command a developer runs: about 80 s of one core with a cold mypy cache, seconds with a warm one.
bash scripts/lint.sh || status=1
# The documentation site (mkdocs.yml, docs/, the API pages from the docstrings): --strict makes every
# warning an error, a broken link or anchor between pages included (about 10 s). tests/test_docs_site.py
# in the main suite also checks the built site's links and opens it in headless Chromium.
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict || status=1
# The main suite (Python 3.11, the newest IPython, ipykernel and ipywidgets the test extra resolves, torch 2.13).
# --durations: the slowest tests in the CI log, for keeping the whole run under 45 minutes.
.venv/bin/python -m pytest -p no:cacheprovider --durations=25 --junitxml=test-artifacts/junit-main.xml || status=1
# The hosted-notebook lanes: every kernel-facing test file, and the wheel installed on the host's pins changing
# none of them (tests/hosts), on each host's own versions (hosts/colab.txt, hosts/kaggle.txt).
# Colab: Python 3.13 in a Debian trixie chroot, IPython 7.34.0, ipykernel 6.17.1, ipywidgets 7.7.1, torch 2.11.0.
# Kaggle: Python 3.12 (pyenv's on this kind of machine; Debian ships none), IPython 7.34.0, ipykernel 6.17.1, ipywidgets 8.1.5,
# torch 2.10.0. scripts/test-host.sh builds and caches their venvs under /var/cache/notebook_launch (a few minutes
# each the first time, seconds after). The Colab lane needs root (chroot). Skip with NOTEBOOK_LAUNCH_SKIP_HOSTS=1
# (never in CI).
if [ -z "${NOTEBOOK_LAUNCH_SKIP_HOSTS:-}" ]; then
  bash scripts/test-colab.sh || status=1
  bash scripts/test-kaggle.sh || status=1
fi
# The torch_xla lane (the TPU backend on PJRT_DEVICE=CPU): scripts/test-xla.sh builds .venv-xla
# (torch 2.9.0 + torch_xla 2.9.0, cached under /var/cache/notebook_launch: 4-8 minutes the first time on a
# machine, under a minute after, fresh clones included), then about a minute of
# tests. A failed download fails the run. Skip with NOTEBOOK_LAUNCH_SKIP_XLA=1 (never in CI).
if [ -z "${NOTEBOOK_LAUNCH_SKIP_XLA:-}" ]; then
  bash scripts/test-xla.sh --junitxml=test-artifacts/junit-xla.xml || status=1
fi
.venv/bin/python scripts/junit_total.py test-artifacts/junit-*.xml || status=1
exit $status
