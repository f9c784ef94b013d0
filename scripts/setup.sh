#!/usr/bin/env bash
# Create .venv with notebook_launch and its test tools. Idempotent.
# torch comes as scripts/quickstart.sh installs it (the version in scripts/torch-version.txt; the CPU build from
# PyTorch's index where no NVIDIA GPU is here, else what pip finds: on this project's machines, their CPU
# wheel), numpy beside it; a torch already in .venv is kept. Any torch >= 2.8 works (pyproject.toml's floor).
#
# A clone without .venv on a machine that built one this week (CI clones afresh each run) takes a hard-linked copy
# of that one instead of building it again: about 2 minutes of two busy cores at the start of every run (torch's
# install and the test extra's resolution), on the run's longest path. The copy is kept under
# /var/cache/notebook_launch/venvs (NOTEBOOK_LAUNCH_HOSTS_CACHE, as the lanes' venvs are) where that folder can be
# written, keyed by what goes into it (pyproject.toml, these scripts, the Python) and by the week: the test extra's
# unpinned tools are still resolved to their newest versions once a week. pip replaces a file by unlinking it and
# Python writes byte code by renaming, so nothing written in the clone's venv reaches the kept one.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV_CACHE=${NOTEBOOK_LAUNCH_HOSTS_CACHE:-/var/cache/notebook_launch}/venvs
key=$( { cat pyproject.toml scripts/setup.sh scripts/quickstart.sh scripts/pip-install.sh scripts/torch-version.txt
         python3 --version; date -u +%G-W%V; } | sha256sum | cut -c1-12)
kept=$VENV_CACHE/main-$key
if [ ! -e .venv ] && [ -f "$kept/.ready" ]; then
  cp -al "$kept" .venv
  rm -f .venv/.ready .venv/.built-in
  # The kept venv names the clone that built it (console scripts' first lines, the editable install's finder
  # and URL): name this one instead. Each file is rewritten whole (a new file: the kept one keeps its text).
  python3 scripts/venv_moved.py "$(<"$kept/.built-in")" "$PWD" .venv
  echo "setup: .venv hard-linked from $kept (built this week from this pyproject.toml and these scripts)" >&2
  exit 0
fi
fresh=
[ -e .venv ] || fresh=1
NOTEBOOK_LAUNCH_VENV=.venv bash scripts/quickstart.sh --install
bash scripts/pip-install.sh .venv/bin/python -e ".[test]"
# jsonschema (imported by Ray, nbformat and jupyter_events) imports rfc3987-syntax where it is installed, and that
# builds some 35 Lark Earley parsers at import: 1.5 s of CPU in every process that imports jsonschema, each Ray
# worker among them, so each Ray rank's start (`import ray` took 2.2 s with it, 0.8 s without; a 4-rank launch on
# the tests' two-node cluster waited 3.4-6.0 s for its actors with it, 1.7-3.3 s without). jupyter-events'
# jsonschema[format-nongpl] brings it back with every install above; nothing these tests validate has an iri
# format, the one thing it checks. docs/guides/ray.md tells users the same for their nodes.
.venv/bin/python -m pip uninstall -y -q rfc3987-syntax || true
# Kept for the next clone (only a venv built from nothing: one that was here before may hold more).
if [ -n "$fresh" ] && mkdir -p "$VENV_CACHE" 2>/dev/null && [ -w "$VENV_CACHE" ]; then
  rm -rf "$kept.partial"
  cp -al .venv "$kept.partial"
  echo "$PWD" >"$kept.partial/.built-in"
  touch "$kept.partial/.ready"
  rm -rf "$kept"
  mv "$kept.partial" "$kept"
  for old in "$VENV_CACHE"/main-*; do   # yesterday's, and those of other pyproject.toml files
    [ "$old" = "$kept" ] || rm -rf "$old"
  done
fi
