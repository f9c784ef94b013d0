#!/usr/bin/env bash
# One hosted-notebook lane: the kernel-facing tests on a hosted notebook's own Python and package versions.
# Usage: scripts/test-host.sh colab|kaggle|py314 [--build-only | pytest arguments or test paths]
#   --build-only   build (or check) the lane's cached venvs and stop: scripts/test.sh starts every lane's build
#                  this way at its start, so the downloads overlap the main suite, and runs the tests later.
# (scripts/test-colab.sh and scripts/test-kaggle.sh call it; scripts/test.sh runs both, so .ci/run does.)
#
#   colab   Python 3.13 (Colab's) in a Debian trixie chroot (scripts/hosts-chroot.sh), hosts/colab.txt.
#   kaggle  Python 3.12 (Kaggle's), the one pyenv keeps on this kind of machine, hosts/kaggle.txt; no chroot
#           (Debian ships no 3.12). Without it the lane falls back to the Python running this script and says so.
#   py314   not a host: Python 3.14 (multiprocessing's default start method is forkserver there) in a Debian sid
#           chroot, hosts/py314.txt (torch 2.13); the launch and persistent-rank tests (PY314_TESTS below).
#
# The hosts/<host>.txt file is the whole pinned environment (every line `name==version`). Two venvs, cached
# outside the clone under /var/cache/notebook_launch (CI clones afresh on the same machine), keyed by a hash
# of the pin file, hosts/lane-tools.txt and LANE_RECIPE:
#   pins  exactly hosts/<host>.txt, never changed after it is built (tests/hosts/test_install_keeps_pins.py
#         installs the built wheel into a copy of it and compares `pip freeze` before and after);
#   lane  a hard-linked copy of pins (no second 5 GB on disk; pip replaces a file by unlinking it, so the
#         pins venv is never written through a link) plus the test tools the host lacks (hosts/lane-tools.txt,
#         constrained by the pins so none of them moves a pinned version).
# The pin files were made by installing the hosts' top-level kernel-side packages with the host's own list as
# constraints (each file's header names it) and writing down `pip freeze --all --exclude pip`:
#   ipython ipykernel jupyter_client traitlets tornado pyzmq ipywidgets widgetsnbextension jupyterlab_widgets
#   matplotlib-inline psutil numpy cloudpickle rich tqdm accelerate torch transformers debugpy
#   nbclient nbformat pytest      (on Colab too, at these versions: the tests' own tools)
# The first build downloads and installs about 5 GB (torch with its nvidia-* wheels): 3-5 minutes; a re-run
# finds both venvs and only reinstalls notebook_launch from this checkout (`pip install --no-deps -e`).
# One junit file per lane: test-artifacts/junit-<host>.xml, totalled by scripts/junit_total.py.
set -euo pipefail
cd "$(dirname "$0")/.."
host=${1:?usage: scripts/test-host.sh colab|kaggle|py314 [--build-only | pytest args]}
shift
build_only=
if [ "${1:-}" = --build-only ]; then
  build_only=1
  shift
fi
pins=hosts/$host.txt
tools=hosts/lane-tools.txt
[ -f "$pins" ] || { echo "test-host: no pin file $pins" >&2; exit 2; }
# Bump to rebuild every lane's venvs (what goes into them changed other than through the files above).
LANE_RECIPE=1
CACHE=${NOTEBOOK_LAUNCH_HOSTS_CACHE:-/var/cache/notebook_launch}
key=$(cat "$pins" "$tools" | sha256sum | cut -c1-12)-r$LANE_RECIPE

# The kernel-facing test files: panel and Stop button, display/input/logging relay, errors pointing at cells,
# magics, persistent ranks, between-cells imports, the notebooks in notebooks/, notebook basics and spawn from
# a kernel, and the install that keeps the host's pins (tests/hosts).
TESTS=(
  tests/test_panel_notebook.py tests/test_stop_button.py
  tests/test_kernel_rank_outputs.py tests/test_rank_stdin.py
  tests/test_cell_errors.py tests/test_magic.py tests/test_persistent_notebook.py tests/test_warm_imports.py
  tests/test_notebooks.py tests/test_kaggle_notebook.py tests/test_notebook_core.py tests/test_spawn_notebook.py
  tests/hosts
)
# The Python 3.14 lane: launches (fork, spawn from the warm start process) and persistent ranks.
PY314_TESTS=(
  tests/test_launch.py tests/test_spawn.py tests/test_start_process.py
  tests/test_persistent_ranks.py tests/test_persistent_spawn.py
)
if [ "$host" = py314 ]; then
  TESTS=("${PY314_TESTS[@]}")
fi
if [ $# -gt 0 ]; then
  TESTS=()   # what the caller named instead
fi

case $host in
  py314)
    HOSTS_SUITE=sid HOSTS_PYTHON_PACKAGES=python3.14,python3.14-venv,python3.14-dev
    source scripts/hosts-chroot.sh
    hosts_chroot_build
    hosts_chroot_mount "$PWD"
    inside=/srv/$host-$key
    outside=$HOSTS_ROOT$inside
    run() { hosts_chroot_run "$@"; }
    python=python3.14
    ;;
  colab)
    source scripts/hosts-chroot.sh
    hosts_chroot_build
    hosts_chroot_mount "$PWD"
    inside=/srv/$host-$key          # as the chroot sees it
    outside=$HOSTS_ROOT$inside      # as this machine sees it
    run() { hosts_chroot_run "$@"; }
    python=python3.13
    ;;
  kaggle)
    mkdir -p "$CACHE/venvs"
    run() { "$@"; }
    python=${KAGGLE_PYTHON:-}
    if [ -z "$python" ]; then
      for python in "$(pyenv root 2>/dev/null || echo /root/.pyenv)"/versions/3.12*/bin/python3.12 \
                    "$(command -v python3.12 || true)" python3; do
        [ -n "$python" ] && "$python" -c 'import venv' 2>/dev/null && break
      done
    fi
    case $("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])') in
      3.12) ;;
      *) echo "test-host: no Python 3.12 here (Kaggle's): the Kaggle lane runs on $("$python" --version)" >&2 ;;
    esac
    key=$key-py$("$python" -c 'import sys; print("%d%d" % sys.version_info[:2])')
    inside=$CACHE/venvs/$host-$key
    outside=$inside
    ;;
  *) echo "test-host: unknown host $host (colab, kaggle or py314)" >&2; exit 2 ;;
esac

if [ ! -f "$outside/.ready" ]; then
  echo "test-host: building the $host venvs at $outside (about 5 GB: 3-5 minutes, once per pin list)" >&2
  rm -rf "$outside"
  run "$python" -m venv "$inside/pins"
  run "$inside/pins/bin/python" -m pip install -q --upgrade "pip>=25.1"   # pip-install.sh resumes downloads
  # pip is quiet: a line every 30 s says how far the 5 GB have come (scripts/build-ticker.sh)
  run bash scripts/pip-install.sh "$inside/pins/bin/python" --progress-bar off -r "$pins" &
  pins_install=$!
  bash scripts/build-ticker.sh "test-host: the $host venv" "$outside" 5 "$pins_install" &
  if ! wait "$pins_install"; then
    echo "test-host: the $host lane's venv could not be built: 'pip install -r $pins' failed (above)" >&2
    exit 1
  fi
  # The venv holds the list exactly, nothing more or less: otherwise the freeze test compares the wrong thing.
  run "$inside/pins/bin/python" -m pip freeze --all --exclude pip >"$outside/pins.freeze"
  if ! diff <(grep -E '^[^#]' "$pins" | grep -v -E '^pip==' | sort -f) <(sort -f "$outside/pins.freeze") >&2; then
    echo "test-host: the $host venv is not $pins exactly (< the list, > the venv): update the list" >&2
    exit 1
  fi
  cp -al "$outside/pins" "$outside/lane"
  run bash scripts/pip-install.sh "$inside/lane/bin/python" --progress-bar off -r "$tools" -c "$pins"
  touch "$outside/.ready"
  echo "test-host: the $host venvs took ${SECONDS} s to build" >&2
  # Venvs of older pin lists: 5 GB each.
  for old in "${outside%-"$key"}"-*; do
    [ "$old" = "$outside" ] || rm -rf "$old"
  done
fi

if [ -n "$build_only" ]; then
  echo "test-host: the $host venvs are ready (${SECONDS} s)" >&2
  exit 0
fi
# notebook_launch itself, fresh from this checkout, every run; never its dependencies (the pins decide those).
run bash scripts/pip-install.sh "$inside/lane/bin/python" --no-deps -e .
mkdir -p test-artifacts
status=0
run env NOTEBOOK_LAUNCH_HOST="$host" NOTEBOOK_LAUNCH_HOST_PINS_VENV="$inside/pins" \
  "$inside/lane/bin/python" -m pytest -p no:cacheprovider --junitxml="test-artifacts/junit-$host.xml" \
  "${TESTS[@]}" "$@" || status=$?
echo "test-host: the $host lane took ${SECONDS} s in all" >&2
exit $status
