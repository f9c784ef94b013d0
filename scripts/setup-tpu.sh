#!/usr/bin/env bash
# Create .venv-tpu: the environment for the TorchTPU (torch_tpu) test lane.
# torch_tpu 0.2.0 needs torch >= 2.11 and <= 2.15 and Python >= 3.11, and pulls libtpu (about 2 GB
# installed with torch_tpu itself). It is kept out of .venv so the main suite runs without libtpu and
# without torch_tpu's import hooks; torch 2.13.0 is the same CPU build .venv uses (from local disk).
# Idempotent: a second run only checks (seconds).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}   # torch_tpu 0.2.0: Python >= 3.11
command -v "$PY" >/dev/null 2>&1 || PY=python3
TORCH=2.13.0 TORCH_TPU=0.2.0
# As scripts/setup-xla.sh: the venv lives outside the clone (CI clones afresh on the same machine), at
# /var/cache/notebook_launch/venvs/tpu-torch2.13.0-torch_tpu0.2.0-pyXY (NOTEBOOK_LAUNCH_HOSTS_CACHE moves
# it); .venv-tpu links to it. A .venv-tpu that is already a folder of its own is used as it is.
if [ ! -e .venv-tpu ]; then
  cache=${NOTEBOOK_LAUNCH_HOSTS_CACHE:-/var/cache/notebook_launch}/venvs
  pyxy=$("$PY" -c 'import sys; print("py%d%d" % sys.version_info[:2])')
  target=$cache/tpu-torch$TORCH-torch_tpu$TORCH_TPU-$pyxy
  if mkdir -p "$cache" 2>/dev/null && [ -w "$cache" ]; then
    [ -x "$target/bin/python" ] || "$PY" -m venv "$target"   # created where it stays: its scripts name that path
    ln -s "$target" .venv-tpu
  fi
fi
if [ ! -x .venv-tpu/bin/python ]; then
  "$PY" -m venv .venv-tpu
fi
V=.venv-tpu/bin/python
# Checked without importing torch_tpu (an import loads libtpu: seconds): the installed versions.
check='import importlib.metadata as m, sys
sys.exit(not (m.version("torch").startswith(sys.argv[1]) and m.version("torch_tpu") == sys.argv[2]
              and m.version("libtpu")))'
if ! "$V" -c "$check" "$TORCH" "$TORCH_TPU" 2>/dev/null; then
  "$V" -m pip install -q --upgrade pip
  echo "setup-tpu: installing torch $TORCH, torch_tpu $TORCH_TPU and libtpu into $(readlink -f .venv-tpu)" \
    "(about 3 GB installed, 2 GB to download: minutes, once per machine)" >&2
  bash scripts/pip-install.sh "$V" "torch==$TORCH" "torch_tpu==$TORCH_TPU" &
  tpu_install=$!
  bash scripts/build-ticker.sh "setup-tpu: .venv-tpu" "$(readlink -f .venv-tpu)" 3 "$tpu_install" &
  if ! wait "$tpu_install"; then
    echo "setup-tpu: the TorchTPU lane's venv could not be built: 'pip install torch==$TORCH" \
      "torch_tpu==$TORCH_TPU' failed (above)" >&2
    exit 1
  fi
fi
bash scripts/pip-install.sh "$V" -e ".[test]"
