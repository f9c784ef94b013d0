#!/usr/bin/env bash
# Static checks of the whole repository: ruff (every .py file and the notebooks), mypy (the package, tests,
# benchmarks, scripts, examples) and the architecture page's package graph. Zero findings. The versions are
# pinned in pyproject's test extra; the
# configuration is pyproject's [tool.ruff] and [tool.mypy]. Run it as `bash scripts/lint.sh` (CI runs it
# from scripts/test.sh). mypy takes about 3 minutes of one core with cold caches (four runs, each reading
# torch's own types), seconds with warm ones. Its cache lives outside the clone, under the cache the host lanes use
# (/var/cache/notebook_launch, kept on a machine across fresh clones, as CI makes), one folder per clone
# path (mypy's cache records source paths); .mypy_cache where that folder cannot be written.
set -uo pipefail
cd "$(dirname "$0")/.."
status=0
cache="${MYPY_CACHE_DIR:-${NOTEBOOK_LAUNCH_HOSTS_CACHE:-/var/cache/notebook_launch}/mypy$(pwd)}"
if ! mkdir -p "$cache" 2>/dev/null || [ ! -w "$cache" ]; then
  cache=.mypy_cache
fi
.venv/bin/ruff check . || status=1
# One mypy run for everything [tool.mypy] files names ... (each run below keeps a cache of its own: runs with
# other options sharing one would each find the other's entries stale)
MYPY_CACHE_DIR="$cache/all" .venv/bin/mypy || status=1
# ... and one per test folder with a conftest.py of its own: its files import their siblings as top-level
# modules (pytest puts the folder on sys.path), and two modules named conftest cannot share a run. Naming the
# files (not the folder) gets past [tool.mypy] exclude, which leaves these folders out of the run above.
for folder in tests/gpu tests/multinode tests/raycluster tests/slurmcluster; do
  MYPYPATH="$folder" MYPY_CACHE_DIR="$cache/${folder//\//-}" .venv/bin/mypy "$folder"/*.py || status=1
done
# docs/architecture.md's package graph and ownership table are the code's (each package's docstring): a
# docstring changed without the page, or the page without the code, is a finding
.venv/bin/python scripts/package_graph.py --check || status=1
exit $status
