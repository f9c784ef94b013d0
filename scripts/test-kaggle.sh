#!/usr/bin/env bash
# The Kaggle lane: the kernel-facing tests on Kaggle's GPU image pins (hosts/kaggle.txt: IPython 7.34.0,
# ipykernel 6.17.1, ipywidgets 8.1.5, torch 2.10.0, ...) on this machine's Python 3.11 (Kaggle runs 3.12, which
# Debian does not ship; scripts/test-host.sh says why 3.11 and not the Colab lane's 3.13); and the wheel
# installed on those pins changes none of them. First run: 3-5 minutes for the venvs (cached in
# /var/cache/notebook_launch); then the tests. Arguments go to pytest (test paths replace the default list).
set -euo pipefail
exec bash "$(dirname "$0")/test-host.sh" kaggle "$@"
