#!/usr/bin/env bash
# A contributor's quick loop, at most 3 minutes on a 2-core machine: the static checks (scripts/lint.sh:
# ruff and mypy; mypy's first run on a machine is slower, its cache makes later runs take seconds) beside the
# fast hermetic tests: the pure planning and parsing, the run state and its displays, the argument checks,
# the import rules. No kernel, cluster or browser; few real ranks. Extra arguments go to pytest
# (`scripts/test-quick.sh -k plan`). Before pushing, the whole command: scripts/test.sh (what CI runs);
# one area with real ranks: scripts/test.sh tests/test_launch.py -n 4. CONTRIBUTING.md says which when.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || bash scripts/setup.sh
# A .venv that scripts/quickstart.sh made has notebook_launch's run-time packages only: say the one command
# that adds the test tools rather than fail on them one raw error at a time.
mapfile -t missing < <(.venv/bin/python scripts/missing_test_tools.py)
if [ "${#missing[@]}" -gt 0 ]; then
  named=$(printf '%s, ' "${missing[@]:0:4}")
  named=${named%, }
  [ "${#missing[@]}" -le 4 ] || named="$named and $((${#missing[@]} - 4)) more"
  echo "quick loop: .venv lacks the test tools ($named): scripts/quickstart.sh installs only what" \
       "notebook_launch needs at run time. Add them once with" >&2
  echo "    bash scripts/setup.sh" >&2
  echo "then run bash scripts/test-quick.sh again." >&2
  exit 2
fi
QUICK=(
  tests/test_plan.py tests/test_rendezvous_settings.py tests/test_environment.py tests/test_session.py
  tests/test_line_prefix.py tests/test_argument_edges.py tests/test_guards.py tests/test_xla_detection.py
  tests/test_panel_state.py tests/test_progress_rows.py tests/test_displays.py tests/test_widget_throttle.py
  tests/test_errors.py tests/test_childfailed_compat.py tests/test_pickled_code.py tests/test_result_tensors_to_cpu.py
  tests/test_log_degrade.py tests/test_long_lines.py tests/test_benchmark_plots.py tests/test_gpu_lane_checks.py
  tests/test_import_graph.py
)
start=$SECONDS
( bash scripts/lint.sh >/tmp/notebook-launch-quick-lint.$$ 2>&1 ) &
lint=$!
status=0
.venv/bin/python -m pytest -p no:cacheprovider -q -n 2 "${QUICK[@]}" "$@" || status=1
wait "$lint" || status=1
cat /tmp/notebook-launch-quick-lint.$$; rm -f /tmp/notebook-launch-quick-lint.$$
echo "quick loop: $((SECONDS - start)) s (goal: 180 s)"
exit $status
