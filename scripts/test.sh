#!/usr/bin/env bash
# Run the whole test suite on a fresh machine: system packages, the venvs, then the pytest lanes.
# With no arguments (CI, .ci/run): the main suite, the Colab lane, the Kaggle lane, the torch_xla lane, the
# TorchTPU lane, then one total line over all lanes and the run's time against its goal. With pytest
# arguments: the main suite only, with those arguments (add `-n 4` for workers). The quick loop for a
# contributor: scripts/test-quick.sh.
#
# What runs at the same time, and why (the run is mostly waiting, not computing: kernels and clusters
# starting, ranks meeting, verdicts awaited):
#   - the lanes' venv builds (downloads and unpacking, about 5-7 GB each on a fresh machine, cached after)
#     start first, in the background, each printing its progress every 30 s, prefixed with its lane;
#   - lint and the docs build run beside the main suite (their output is printed when they end);
#   - the main suite runs in NOTEBOOK_LAUNCH_TEST_WORKERS pytest-xdist workers (default 4 on 2 cores), with
#     --dist loadgroup: the tests of a module that share a module-scoped fixture (a benchmark run of
#     minutes, a notebook run in a kernel) go to one worker, which builds the fixture once, not once per
#     worker that got some of them (tests/helpers/xdist_groups.py); the other tests go wherever a worker is
#     free; but not tests/raycluster, whose modules share one two-node Ray cluster (its conftest): it runs after it as
#     one pytest process of its own (one cluster, not one per worker), beside the lanes (its Ray actors
#     start slowly beside four busy workers); tests/slurmcluster (one two-node SLURM) likewise, in a second
#     process beside it (each cluster in namespaces of its own: they share nothing);
#   - the lanes' tests run side by side once their venvs are ready and the Ray cluster is up (beside four lanes
#     starting their kernels it took 212 s to come up, not 30), each printed whole when it ends.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/system-packages.sh
bash scripts/setup.sh
mkdir -p test-artifacts
rm -f test-artifacts/junit-*.xml
if [ $# -gt 0 ]; then
  exec .venv/bin/python -m pytest -p no:cacheprovider "$@"
fi
# Goals for the whole command on a 2-core machine (issue 36): with the lanes' venvs cached, and without.
GOAL_WARM_S=$((25 * 60))
GOAL_FRESH_S=$((45 * 60))
WORKERS=${NOTEBOOK_LAUNCH_TEST_WORKERS:-4}
status=0
lanes=()
[ -z "${NOTEBOOK_LAUNCH_SKIP_HOSTS:-}" ] && lanes+=(colab kaggle)   # skip: never in CI
[ -z "${NOTEBOOK_LAUNCH_SKIP_XLA:-}" ] && lanes+=(xla)              # skip: never in CI
[ -z "${NOTEBOOK_LAUNCH_SKIP_TPU:-}" ] && lanes+=(tpu)              # skip: never in CI
[ -z "${NOTEBOOK_LAUNCH_SKIP_PY314:-}" ] && lanes+=(py314)          # skip: never in CI
declare -A build_pid lane_pid lane_took
fresh=
mmss() { printf '%d:%02d' $(($1 / 60)) $(($1 % 60)); }
# Where the run's time goes, for tuning it: each part's CPU seconds (its processes and every descendant they
# reaped, from bash's `times`; Ray's and SLURM's daemons are not its descendants) and how busy the whole
# machine was during the main suite and after it (/proc/stat). On 2 cores a part that keeps the machine busy
# can only get faster by burning less CPU; one that leaves it idle, by waiting less.
children_cpu() {   # (`times` into a file: in a pipe it would report the pipe's own subshell)
  local f; f=$(mktemp); times >"$f"
  awk 'NR == 2 { split($1, u, /[ms]/); split($2, s, /[ms]/); printf "%d", u[1] * 60 + u[2] + s[1] * 60 + s[2] }' "$f"
  rm -f "$f"; }
cpu_mark() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8, $5 + $6 }' /proc/stat; }
busy_since() { local busy idle; read -r busy idle <<<"$1"; cpu_mark | awk -v b="$busy" -v i="$idle" \
  '{ d = ($1 - b) + ($2 - i); printf "%d%%", (d > 0 ? 100 * ($1 - b) / d : 0) }'; }
cpu_of() { cat "test-artifacts/$1.cpu" 2>/dev/null || echo "?"; }

# The lanes' venvs (scripts/test-host.sh, scripts/setup-xla.sh, scripts/setup-tpu.sh): seconds when cached,
# minutes of downloads the first time. A build that fails fails the run, naming its lane; its tests then do not run.
for lane in "${lanes[@]}"; do
  case $lane in
    xla) cmd=(bash scripts/setup-xla.sh) ;;
    tpu) cmd=(bash scripts/setup-tpu.sh) ;;
    *) cmd=(bash scripts/test-host.sh "$lane" --build-only) ;;
  esac
  ( "${cmd[@]}" 2>&1 | tee "test-artifacts/build-$lane.log" | sed -u "s/^/[$lane lane build] /" >&2
    exit "${PIPESTATUS[0]}" ) &
  build_pid[$lane]=$!
done

# Static checks (ruff and mypy, pinned in pyproject's test extra; zero findings) and the documentation site
# (--strict: every warning an error, a broken link or anchor between pages included), beside the main suite.
( bash scripts/lint.sh >test-artifacts/lint.log 2>&1 ) &
lint_pid=$!
( NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict >test-artifacts/docs.log 2>&1 ) &
docs_pid=$!

# The main suite (Python 3.11, the newest IPython, ipykernel and ipywidgets the test extra resolves, torch 2.13).
# --durations: the slowest tests in the CI log.
main_start=$SECONDS
main_mark=$(cpu_mark)
( rc=0; .venv/bin/python -m pytest -p no:cacheprovider -n "$WORKERS" --dist loadgroup --durations=25 \
    --ignore=tests/raycluster \
    --ignore=tests/slurmcluster \
    --junitxml=test-artifacts/junit-main.xml || rc=$?
  children_cpu >test-artifacts/main.cpu; exit $rc ) || status=1
main_took=$((SECONDS - main_start))
main_busy=$(busy_since "$main_mark")
after_mark=$(cpu_mark)
# The two clusters' tests: one pytest process each (one cluster each), side by side.
declare -A cluster_pid
clusters=(raycluster slurmcluster)
ray_started=test-artifacts/raycluster.started
rm -f "$ray_started"
for cluster in "${clusters[@]}"; do
  ( start=$SECONDS; rc=0
    NOTEBOOK_LAUNCH_TEST_RAY_STARTED=$PWD/$ray_started .venv/bin/python -m pytest -p no:cacheprovider \
      --durations=10 --junitxml="test-artifacts/junit-$cluster.xml" \
      "tests/$cluster" >"test-artifacts/$cluster.log" 2>&1 || rc=$?
    echo "$((SECONDS - start))" >"test-artifacts/$cluster.seconds"; children_cpu >"test-artifacts/$cluster.cpu"
    exit $rc ) &
  cluster_pid[$cluster]=$!
done

wait "$lint_pid" || { status=1; echo "lint: findings (above)" >>test-artifacts/lint.log; }
echo "=== lint (scripts/lint.sh)"; cat test-artifacts/lint.log
wait "$docs_pid" || { status=1; echo "docs: mkdocs build --strict failed (above)" >>test-artifacts/docs.log; }
echo "=== docs (mkdocs build --strict)"; cat test-artifacts/docs.log

# The hosted-notebook lanes: every kernel-facing test file, and the wheel installed on the host's pins changing
# none of them (tests/hosts), on each host's own versions (hosts/colab.txt, hosts/kaggle.txt).
# Colab: Python 3.13 in a Debian trixie chroot, IPython 7.34.0, ipykernel 6.17.1, ipywidgets 7.7.1, torch 2.11.0.
# Kaggle: Python 3.12 (pyenv's on this kind of machine; Debian ships none), IPython 7.34.0, ipykernel 6.17.1,
# ipywidgets 8.1.5, torch 2.10.0. The Colab lane needs root (chroot).
# The torch_xla lane (the TPU backend on PJRT_DEVICE=CPU): .venv-xla (torch 2.9.0 + torch_xla 2.9.0).
# The TorchTPU lane (torch_tpu without a chip: detection, the ranks' environment against torch_tpu's own code,
# CPU launches beside it): .venv-tpu (torch 2.13.0 + torch_tpu 0.2.0 + libtpu); the chip tests skip there.
# The Python 3.14 lane: launches and persistent ranks on Python 3.14 (forkserver is multiprocessing's default
# there) in a Debian sid chroot, torch 2.13.0 (hosts/py314.txt). Needs root (chroot).
# The lanes start once the Ray cluster is up (tests/raycluster/conftest.py touches the file; at most 3
# minutes): Ray gives each raylet a fixed 30 s to register, which it missed beside four lanes starting
# their kernels (the cluster took 212 s to come up in one CI run instead of about 30).
for _ in $(seq 180); do
  [ -e "$ray_started" ] || ! kill -0 "${cluster_pid[raycluster]}" 2>/dev/null && break
  sleep 1
done
for lane in "${lanes[@]}"; do
  if ! wait "${build_pid[$lane]}"; then
    echo "=== the $lane lane: its venv could not be built (the lines marked [$lane lane build] above say why)"
    status=1
    continue
  fi
  # The build scripts say when they download and install (not cached): the run is then a fresh machine's.
  if grep -q -e "building the $lane venvs" -e "installing torch 2.9.0" -e "installing torch 2.13.0, torch_tpu" \
      "test-artifacts/build-$lane.log"; then
    fresh=1
  fi
  case $lane in
    xla) cmd=(bash scripts/test-xla.sh --junitxml=test-artifacts/junit-xla.xml) ;;
    tpu) cmd=(bash scripts/test-tpu-lane.sh --durations=5 --junitxml=test-artifacts/junit-tpu.xml) ;;
    *) cmd=(bash "scripts/test-$lane.sh") ;;
  esac
  # At a lower CPU priority (nice 10): tests/raycluster beside them is the run's longest path (12:32 beside
  # the lanes at nice 5, 6:17 alone; the lanes ended 2-3 minutes before it). Its Ray ranks' starts (a worker
  # process importing ray and torch) are its CPU: `import ray, torch` beside six busy processes took 5.5 s
  # alone, 8-29 s with them at nice 5, 8-13 s at nice 10, 5.5-7.5 s at nice 19 (others' tests beside); nice 10
  # leaves the lanes, mostly waiting themselves, the CPU the cluster's tests do not use.
  ( start=$SECONDS; rc=0; nice -n 10 "${cmd[@]}" >"test-artifacts/lane-$lane.log" 2>&1 || rc=$?   # (set -e: not bare)
    echo "$((SECONDS - start))" >"test-artifacts/lane-$lane.seconds"; children_cpu >"test-artifacts/lane-$lane.cpu"
    exit $rc ) &
  lane_pid[$lane]=$!
done
for lane in "${lanes[@]}"; do
  [ -n "${lane_pid[$lane]:-}" ] || continue
  wait "${lane_pid[$lane]}" || status=1
  lane_took[$lane]=$(cat "test-artifacts/lane-$lane.seconds" 2>/dev/null || echo 0)
  echo "=== the $lane lane ($(mmss "${lane_took[$lane]}"))"
  cat "test-artifacts/lane-$lane.log"
done

declare -A cluster_took
for cluster in "${clusters[@]}"; do
  wait "${cluster_pid[$cluster]}" || status=1
  cluster_took[$cluster]=$(cat "test-artifacts/$cluster.seconds" 2>/dev/null || echo 0)
  echo "=== tests/$cluster ($(mmss "${cluster_took[$cluster]}"), after the main suite, beside the lanes)"
  cat "test-artifacts/$cluster.log"
done
.venv/bin/python scripts/junit_total.py test-artifacts/junit-*.xml || status=1
echo "=== where the main suite's CPU went (tests/helpers/cpu_per_test.py)"
.venv/bin/python scripts/junit_cpu.py test-artifacts/junit-main.xml || true
after_busy=$(busy_since "$after_mark")
echo "main suite: $(mmss "$main_took") ($WORKERS workers, $(cpu_of main) s of CPU, the machine $main_busy busy);" \
  "after it, side by side (the machine $after_busy busy):" \
  "tests/raycluster $(mmss "${cluster_took[raycluster]}") ($(cpu_of raycluster) s of CPU)," \
  "tests/slurmcluster $(mmss "${cluster_took[slurmcluster]}") ($(cpu_of slurmcluster) s of CPU)"
for lane in "${lanes[@]}"; do
  [ -n "${lane_took[$lane]:-}" ] && echo "$lane lane: $(mmss "${lane_took[$lane]}") ($(cpu_of "lane-$lane") s of CPU," \
    "beside the other lanes)"
done
if [ -n "$fresh" ]; then goal=$GOAL_FRESH_S kind="a fresh machine (lanes' venvs built)"; else
  goal=$GOAL_WARM_S kind="the lanes' venvs cached"; fi
echo "whole run: $(mmss "$SECONDS") against a goal of $(mmss "$goal") with $kind"
exit $status
