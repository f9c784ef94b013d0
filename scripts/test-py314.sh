#!/usr/bin/env bash
# The Python 3.14 lane: the launch and persistent-rank tests on Python 3.14 (Debian sid's, in a chroot:
# scripts/hosts-chroot.sh), where multiprocessing starts processes with forkserver by default, with torch 2.13
# (hosts/py314.txt). Needs root. First run: about 2 minutes for the chroot and 3-5 for the venvs (cached in
# /var/cache/notebook_launch); then the tests. Arguments go to pytest (test paths replace the default list).
# See scripts/test-host.sh.
set -euo pipefail
exec bash "$(dirname "$0")/test-host.sh" py314 "$@"
