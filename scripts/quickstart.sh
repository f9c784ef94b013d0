#!/usr/bin/env bash
# A fresh machine's first run: a venv with notebook_launch and what it needs at run time (torch, numpy,
# cloudpickle, rich, ipywidgets, ipython; no test tools), then a small real training on 2 CPU ranks
# (examples/train_cpu.py: DDP over gloo). Idempotent: a second run only trains.
#
# Which torch it installs, said before it installs it (scripts/torch-version.txt: 2.13.0, the version CI runs,
# which the shipped notebooks' first cells pin too; any torch >= 2.8
# works, installed first the way your machine needs it: pip keeps a torch that is already there):
#   - no NVIDIA GPU here: PyTorch's CPU wheels, from PyTorch's own index ($TORCH_CPU_INDEX, default
#     https://download.pytorch.org/whl/cpu; about 200 MB to download, 1 GB installed). When that index cannot
#     be reached, pip's own index instead, saying so: a CPU wheel pip finds (a local folder or mirror, as on
#     this project's machines), or else PyPI's Linux torch, which is the CUDA build (about 7 GB installed);
#   - an NVIDIA GPU here (nvidia-smi lists one): PyPI's torch, the CUDA build, with its size.
# After the install it says which build it got and the venv's size.
#
# Usage: bash scripts/quickstart.sh            set up (if needed) and train
#        bash scripts/quickstart.sh --plan     say which torch it would install, and from where; change nothing
#        bash scripts/quickstart.sh --install  set up (if needed), without the training (scripts/setup.sh's start)
# Variables: NOTEBOOK_LAUNCH_VENV (the venv's folder, default .venv in the clone), PYTHON (the Python that
# creates it, default python3), TORCH_CPU_INDEX, TORCH_INDEX_TIMEOUT (seconds to wait for that index, default 10).
# scripts/setup.sh adds the test tools to the same .venv (scripts/test.sh runs it; scripts/test-quick.sh says to).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${NOTEBOOK_LAUNCH_VENV:-.venv}
TORCH_SPEC="torch==$(<scripts/torch-version.txt)"
CPU_INDEX=${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}
INDEX_TIMEOUT=${TORCH_INDEX_TIMEOUT:-10}

say() { echo "quickstart: $*" >&2; }

# The first GPU nvidia-smi lists ("GPU 0: ..."), empty when there is none. Its whole list is read before it
# is searched: a reader that stops at the first match (grep -q, head) can leave nvidia-smi writing the rest
# into a closed pipe, and under pipefail its SIGPIPE then read as "no GPU" on a machine with several.
first_nvidia_gpu() {
  command -v nvidia-smi >/dev/null 2>&1 || return 0
  local listed
  listed=$(nvidia-smi -L 2>/dev/null) || true
  grep -m1 '^GPU ' <<<"$listed" || true
}

# Empty when PyTorch's CPU index answers for torch, else why it did not (one line).
cpu_index_unreachable() {
  "$PY" - "${CPU_INDEX%/}/torch/" "$INDEX_TIMEOUT" <<'EOF'
import sys, urllib.request
try:
    urllib.request.urlopen(urllib.request.Request(sys.argv[1], method="HEAD"), timeout=float(sys.argv[2])).close()
except Exception as exc:
    print(getattr(exc, "reason", None) or exc)
EOF
}

# Decides where torch comes from: says why on stderr, and sets TORCH_PIP_ARGS (what follows `pip install`).
choose_torch() {
  local gpu
  gpu=$(first_nvidia_gpu)
  if [ -n "$gpu" ]; then
    say "an NVIDIA GPU is here ($gpu): installing $TORCH_SPEC from PyPI," \
        "the CUDA build: torch, triton and 14 nvidia-* libraries, about 3.5 GB to download and 7 GB installed"
    TORCH_PIP_ARGS=("$TORCH_SPEC")
    return
  fi
  local why
  why=$(cpu_index_unreachable)
  if [ -z "$why" ]; then
    say "no NVIDIA GPU here: installing $TORCH_SPEC's CPU build from PyTorch's index $CPU_INDEX" \
        "(about 200 MB to download, 1 GB installed)"
    TORCH_PIP_ARGS=("$TORCH_SPEC" --index-url "$CPU_INDEX")
  else
    say "no NVIDIA GPU here, but PyTorch's CPU index $CPU_INDEX cannot be reached ($why)."
    say "Falling back to pip's own index for $TORCH_SPEC: a CPU wheel where pip finds one (a local folder or" \
        "mirror), else PyPI's Linux torch, which is the CUDA build (about 7 GB installed)."
    say "Another torch: install it into $VENV first, the way your machine needs it (quickstart keeps any torch" \
        "there), or set TORCH_CPU_INDEX to a mirror of $CPU_INDEX."
    TORCH_PIP_ARGS=("$TORCH_SPEC")
  fi
}

# Which torch build the venv holds, and the venv's size.
report_torch() {
  local build
  build=$("$VENV/bin/python" -c 'import torch; print(torch.__version__, "CUDA " + torch.version.cuda if torch.version.cuda else "CPU", "build")')
  say "installed torch $build; $VENV takes $(du -sh "$VENV" | cut -f1)"
}

if [ "${1:-}" = "--plan" ]; then
  choose_torch
  echo "pip install ${TORCH_PIP_ARGS[*]}"
  exit 0
fi

if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
# numpy before anything imports torch: torch's wheels do not require it, and an `import torch` without it
# (report_torch's, right after torch's install, once printed it) warns "Failed to initialize NumPy"
bash scripts/pip-install.sh "$VENV/bin/python" numpy
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  choose_torch
  bash scripts/pip-install.sh "$VENV/bin/python" "${TORCH_PIP_ARGS[@]}"
  report_torch
fi
bash scripts/pip-install.sh "$VENV/bin/python" -e .
if [ "${1:-}" = "--install" ]; then
  exit 0
fi
exec "$VENV/bin/python" examples/train_cpu.py
