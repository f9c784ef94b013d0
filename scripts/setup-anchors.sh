#!/usr/bin/env bash
# Create the venvs of the persistent-call and launch anchors that benchmarks/anchors.py (item 15) times beside
# this project: .venv-monarch (Meta's Monarch, torchmonarch 0.7.0) and .venv-torchrunx (torchrunx 0.4.0), each
# with torch 2.13.0 (the CPU build, as .venv has); the benchmark's worker imports the benchmarks package from
# the repository through PYTHONPATH, so no checkout is installed there. Each anchor lives in its own venv
# because its pins (numpy, cloudpickle, torch's own range) are not this project's to choose.
# Cached like scripts/setup-xla.sh: the venv lives under /var/cache/notebook_launch/venvs
# (NOTEBOOK_LAUNCH_HOSTS_CACHE moves it) and .venv-NAME links to it. Idempotent: a second run only checks.
#     bash scripts/setup-anchors.sh [monarch|torchrunx ...]   (default: both)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
TORCH="torch==$(<scripts/torch-version.txt)"

declare -A SPEC=([monarch]="torchmonarch==0.7.0" [torchrunx]="torchrunx==0.4.0")
# what else each needs: Monarch's side of item 15's notebook row runs in a kernel of its venv's Python
declare -A EXTRA=([monarch]="ipykernel" [torchrunx]="")
declare -A PROBE=([monarch]="import monarch.actor, ipykernel" [torchrunx]="import torchrunx")

build() {
  local name=$1 venv=.venv-$1
  if [ ! -e "$venv" ]; then
    local cache=${NOTEBOOK_LAUNCH_HOSTS_CACHE:-/var/cache/notebook_launch}/venvs
    local target=$cache/$name-${SPEC[$name]//==/}-$("$PY" -c 'import sys; print("py%d%d" % sys.version_info[:2])')
    if mkdir -p "$cache" 2>/dev/null && [ -w "$cache" ]; then
      [ -x "$target/bin/python" ] || "$PY" -m venv "$target"
      ln -s "$target" "$venv"
    fi
  fi
  [ -x "$venv/bin/python" ] || "$PY" -m venv "$venv"
  local V=$venv/bin/python
  if ! "$V" -c "${PROBE[$name]}, torch" 2>/dev/null; then
    "$V" -m pip install -q --upgrade pip
    echo "setup-anchors: installing ${SPEC[$name]} beside $TORCH into $(readlink -f "$venv")" >&2
    # shellcheck disable=SC2086  # EXTRA is a list of requirements, split on purpose
    bash scripts/pip-install.sh "$V" "$TORCH" "${SPEC[$name]}" psutil ${EXTRA[$name]}
  fi
}

names=("$@")
[ ${#names[@]} -gt 0 ] || names=(monarch torchrunx)
for name in "${names[@]}"; do
  [ -n "${SPEC[$name]:-}" ] || { echo "setup-anchors: unknown anchor '$name' (monarch, torchrunx)" >&2; exit 2; }
  build "$name"
done
