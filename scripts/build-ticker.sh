#!/usr/bin/env bash
# Progress of a long venv build, printed as it goes: usage `scripts/build-ticker.sh LABEL DIR EXPECTED_GB PID`.
# Every 30 s, while process PID (the build) lives, one line on stderr: what DIR holds so far against what the
# build is expected to download and install, and how long it has taken. pip runs quietly (-q) in the lanes'
# builds, so without this a fresh machine's first run would sit silent for minutes per lane.
set -uo pipefail
label=$1 dir=$2 expected=$3 pid=$4
start=$SECONDS
while kill -0 "$pid" 2>/dev/null; do
  sleep 30
  kill -0 "$pid" 2>/dev/null || break
  size=$(du -sm "$dir" 2>/dev/null | cut -f1)
  awk -v l="$label" -v m="${size:-0}" -v e="$expected" -v s="$((SECONDS - start))" \
    'BEGIN { printf "%s: building, %.1f GB of about %s GB installed, %d s so far\n", l, m / 1024, e, s }' >&2
done
