#!/usr/bin/env bash
# The Colab lane: the kernel-facing tests on Colab's Python 3.13 and its pinned kernel stack (hosts/colab.txt:
# IPython 7.34.0, ipykernel 6.17.1, jupyter_client 7.4.9, traitlets 5.7.1, ipywidgets 7.7.1, torch 2.11.0,
# accelerate 1.14.0, ...), in a Debian trixie chroot; and the wheel installed on those pins changes none of them.
# Needs root. First run: about 2 minutes for the chroot and 3-5 for the venvs (cached in
# /var/cache/notebook_launch); then the tests. Arguments go to pytest (test paths replace the default list).
# See scripts/test-host.sh.
set -euo pipefail
exec bash "$(dirname "$0")/test-host.sh" colab "$@"
