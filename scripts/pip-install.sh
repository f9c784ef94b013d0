#!/usr/bin/env bash
# pip install, robust to a dropped connection: usage `scripts/pip-install.sh VENV_PYTHON ARGS...`.
# A CI run once failed on one (pip resumed the 900 MB torch 2.9.0 wheel 5 times from the same byte, then
# gave up), so pip resumes more often and waits longer, and the whole install is tried again after a
# pause (fresh connections) before the setup counts as failed. What is already installed stays.
set -euo pipefail
python=$1
shift
for attempt in 1 2 3 4; do
  if "$python" -m pip install -q --retries 10 --timeout 60 --resume-retries 30 "$@"; then
    exit 0
  fi
  if [ "$attempt" = 4 ]; then
    echo "pip-install: 'pip install $*' failed 4 times" >&2
    exit 1
  fi
  echo "pip-install: try $attempt failed; trying again in $((attempt * 30)) s" >&2
  sleep $((attempt * 30))
done
