#!/usr/bin/env bash
# Static checks of the whole repository: ruff (every .py file and the notebooks) and mypy (the package, tests,
# benchmarks, scripts, examples). Zero findings. The versions are pinned in pyproject's test extra; the
# configuration is pyproject's [tool.ruff] and [tool.mypy]. Run it as `bash scripts/lint.sh` (CI runs it
# from scripts/test.sh). mypy keeps its cache in .mypy_cache: about 80 s of one core cold, seconds after.
set -uo pipefail
cd "$(dirname "$0")/.."
status=0
.venv/bin/ruff check . || status=1
# One mypy run for everything [tool.mypy] files names ...
.venv/bin/mypy || status=1
# ... and one per test folder with a conftest.py of its own: its files import their siblings as top-level
# modules (pytest puts the folder on sys.path), and two modules named conftest cannot share a run. Naming the
# files (not the folder) gets past [tool.mypy] exclude, which leaves these folders out of the run above.
for folder in tests/gpu tests/multinode tests/raycluster; do
  MYPYPATH="$folder" .venv/bin/mypy "$folder"/*.py || status=1
done
exit $status
