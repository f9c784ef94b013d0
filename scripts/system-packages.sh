#!/usr/bin/env bash
# Debian packages the tests need. Skipped when already present or when not root.
set -euo pipefail
need=()
# chromium: the live panel's browser test (tests/test_browser_panel.py) drives Debian's build
# slurm-wlm, munge: tests/slurmcluster starts a real two-node SLURM (slurmctld, slurmd, munged)
for pair in "ip:iproute2" "chromium:chromium" "slurmctld:slurm-wlm" "munged:munge"; do
  cmd=${pair%%:*}; pkg=${pair#*:}
  command -v "$cmd" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  else
    echo "system-packages: missing ${need[*]} (run as root to install them)" >&2
  fi
fi
