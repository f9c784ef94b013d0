#!/usr/bin/env bash
# The CUDA lane: tests/gpu on a machine with NVIDIA GPUs, with the CUDA build of torch that
# machine already has (a GPU image, Kaggle, Colab). Never installs torch: a CPU torch from PyPI
# would replace the CUDA one. Not part of scripts/test.sh / .ci/run (CI has no GPU; there
# tests/gpu is collected and skipped with its reason).
#
#   bash scripts/test-gpu.sh                       # python3 must be the one holding CUDA torch
#   PYTHON=/opt/torch/.venv/bin/python3 bash scripts/test-gpu.sh -k nccl
#   NOTEBOOK_LAUNCH_WHEELS=wheels-gpu bash scripts/test-gpu.sh   # offline: test tools from a folder
#   bash scripts/test-gpu.sh --download-wheels wheels-gpu        # (on a machine with network) fill it
#   bash scripts/test-gpu.sh --download-wheels wheels-gpu 3.12   # ... for the GPU machine's Python
#
# No venv: the machine's python (often itself a venv, whose packages a nested venv would not
# see) runs the tests; our package comes from this checkout via PYTHONPATH (no build, no
# download); what the tests need and the image lacks (a Jupyter kernel and client) goes into
# .gpu-lane-packages (pip --target, on PYTHONPATH), never over the CUDA torch.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# What the tests need, pip package -> module (ipython is imported as IPython): tests/gpu/lane_packages.py
read -r -a NEEDED <<< "$("$PY" tests/gpu/lane_packages.py all)"

if [ "${1:-}" = "--download-wheels" ]; then
  dest=${2:?usage: scripts/test-gpu.sh --download-wheels FOLDER [PYTHON_VERSION, e.g. 3.12]}
  # the wheels are for the GPU machine's Python (pyzmq, tornado, psutil are built per version)
  pyver=${3:-$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')}
  "$PY" -m pip download -q -d "$dest" --only-binary=:all: --python-version "$pyver" --implementation cp \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_28_x86_64 "${NEEDED[@]}"
  echo "wheels for Python $pyver in $dest; carry it to the GPU machine and set NOTEBOOK_LAUNCH_WHEELS=$dest"
  exit 0
fi

if ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.version.cuda else 1)' 2>/dev/null; then
  echo "test-gpu.sh: $PY has no CUDA build of torch; run it where one is installed (PYTHON=...)." >&2
  "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' >&2 || true
  exit 1
fi
EXTRA="$PWD/.gpu-lane-packages"
export PYTHONPATH="$PWD:$EXTRA${PYTHONPATH:+:$PYTHONPATH}"
missing=()
read -r -a missing <<< "$("$PY" tests/gpu/lane_packages.py missing)"
if [ ${#missing[@]} -gt 0 ]; then
  echo "test-gpu.sh: installing ${missing[*]} into $EXTRA"
  from=(--timeout 15 --retries 1)
  [ -n "${NOTEBOOK_LAUNCH_WHEELS:-}" ] && from=(--no-index --find-links "$NOTEBOOK_LAUNCH_WHEELS")
  "$PY" -m pip install -q --target "$EXTRA" "${from[@]}" "${missing[@]}" \
    || echo "test-gpu.sh: could not install ${missing[*]}; the notebook (kernel) tests will skip" >&2
  rm -rf "$EXTRA"/torch "$EXTRA"/torch-*.dist-info   # in case a dependency pulled one in
fi
nvidia-smi -L || true
"$PY" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, "GPUs", torch.cuda.device_count())'
mkdir -p test-artifacts
exec "$PY" -m pytest -p no:cacheprovider -o addopts="-ra" tests/gpu "$@"
