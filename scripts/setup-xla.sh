#!/usr/bin/env bash
# Create .venv-xla: the environment for the real torch_xla test lane.
# torch_xla 2.9.0 is binary-tied to torch 2.9.0 (it fails to import next to the
# torch 2.13 CPU build that .venv uses), and PyPI only has the CUDA build of
# torch 2.9.0 for Linux (with its nvidia-* wheels: 7.2 GB installed, 8 minutes
# on a 2-core machine), so this lane lives in its own venv. Idempotent: a
# second run only checks (about 15 s).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}   # torch_xla 2.9.0 has wheels for CPython 3.10-3.13
command -v "$PY" >/dev/null 2>&1 || PY=python3
# The venv itself lives outside the clone, where the user may write there (CI clones afresh on the same
# machine, so every run used to download and install those 7 GB again): .venv-xla is then a link to
# /var/cache/notebook_launch/venvs/xla-torch2.9.0-pyXY (NOTEBOOK_LAUNCH_HOSTS_CACHE moves it, as for the
# hosted lanes). Only this checkout is installed anew each run (`pip install -e`). A .venv-xla that is
# already a folder of its own is used as it is.
if [ ! -e .venv-xla ]; then
  cache=${NOTEBOOK_LAUNCH_HOSTS_CACHE:-/var/cache/notebook_launch}/venvs
  target=$cache/xla-torch2.9.0-$("$PY" -c 'import sys; print("py%d%d" % sys.version_info[:2])')
  if mkdir -p "$cache" 2>/dev/null && [ -w "$cache" ]; then
    [ -x "$target/bin/python" ] || "$PY" -m venv "$target"   # created where it stays: its scripts name that path
    ln -s "$target" .venv-xla
  fi
fi
if [ ! -x .venv-xla/bin/python ]; then
  "$PY" -m venv .venv-xla
fi
V=.venv-xla/bin/python
if ! "$V" -c 'import torch, torch_xla, sys; sys.exit(not (torch.__version__.startswith("2.9.0") and torch_xla.__version__.startswith("2.9.0")))' 2>/dev/null; then
  "$V" -m pip install -q --upgrade pip
  echo "setup-xla: installing torch 2.9.0 and torch_xla 2.9.0 into $(readlink -f .venv-xla) (7.2 GB installed, about 3 GB to download: 4-8 minutes, once per machine)" >&2
  bash scripts/pip-install.sh "$V" "torch==2.9.0" "torch_xla==2.9.0" &   # about 3 GB from PyPI
  xla_install=$!
  bash scripts/build-ticker.sh "setup-xla: .venv-xla" "$(readlink -f .venv-xla)" 7.2 "$xla_install" &
  if ! wait "$xla_install"; then
    echo "setup-xla: the torch_xla lane's venv could not be built: 'pip install torch==2.9.0 torch_xla==2.9.0' failed (above)" >&2
    exit 1
  fi
fi
bash scripts/pip-install.sh "$V" -e ".[test]"
