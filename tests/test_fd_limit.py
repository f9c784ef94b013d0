"""Too many ranks for the open-file limit: checked before anything opens, the soft limit
raised when the hard limit allows, otherwise a clear error; nothing leaks on a failed start.
Each case runs in its own Python process with a lowered RLIMIT_NOFILE."""
import json
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import json, os, resource, sys
    soft, hard = {soft}, {hard}
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    import torch  # noqa: F401  (as in a notebook: imported before the launch)
    from notebook_launch import LaunchArgumentError, notebook_launcher
    {patch}
    def fds():
        return sorted(int(n) for n in os.listdir("/proc/self/fd"))
    def f():
        return os.getpid()
    notebook_launcher(f, num_processes=1, ui="none", log_dir=sys.argv[1] + "/warm")  # lazy imports settle
    before = fds()
    outcome = {{}}
    try:
        results = notebook_launcher(f, num_processes={n}, ui="none", log_dir=sys.argv[1] + "/run")
        outcome["results"] = len(results)
    except BaseException as exc:
        outcome["error"] = type(exc).__name__
        outcome["message"] = str(exc)
    outcome["leaked"] = sorted(set(fds()) - set(before))
    outcome["soft_after"] = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    print("OUTCOME " + json.dumps(outcome))
""")


def run_case(tmp_path, *, soft, hard, n, patch=""):
    code = SCRIPT.format(soft=soft, hard=hard, n=n, patch=patch)
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True,
                          timeout=240)
    line = [x for x in proc.stdout.splitlines() if x.startswith("OUTCOME ")]
    assert line, proc.stdout + proc.stderr
    return json.loads(line[-1][len("OUTCOME "):]), proc.stdout


def test_too_many_ranks_for_the_hard_limit_is_a_clear_error(tmp_path):
    outcome, _ = run_case(tmp_path, soft=128, hard=128, n=40)
    assert outcome["error"] == "LaunchArgumentError", outcome
    assert "num_processes=40 needs about" in outcome["message"]
    assert "open-file limit is 128" in outcome["message"] and "ulimit" in outcome["message"]
    assert outcome["leaked"] == []


def test_soft_limit_is_raised_when_the_hard_limit_allows(tmp_path):
    outcome, out = run_case(tmp_path, soft=128, hard=4096, n=40)
    assert outcome.get("results") == 40, outcome
    assert outcome["soft_after"] > 128
    assert "raised this process's open-file limit" in out
    assert outcome["leaked"] == []


def test_a_start_that_runs_out_of_fds_midway_leaks_nothing(tmp_path):
    # Stand-in for a limit that shrank after the check (another thread opened files):
    # the check is bypassed, so the start itself hits EMFILE.
    patch = "import notebook_launch.planning.fd_budget as b; b.FDS_PER_RANK = 0; b.FDS_SPARE = 0"
    outcome, _ = run_case(tmp_path, soft=96, hard=96, n=40, patch=patch)
    assert "error" in outcome, outcome
    assert "Too many open files" in outcome["message"] or "open-file limit" in outcome["message"]
    assert outcome["leaked"] == [], f"fds left open after a failed start: {outcome['leaked']}"


TOO_TIGHT_FOR_ONE = textwrap.dedent("""
    import json, os, resource, sys
    import torch  # noqa: F401
    from notebook_launch import LaunchArgumentError, notebook_launcher
    from notebook_launch.planning import fd_budget
    open_now = fd_budget.fds_in_use()
    limit = open_now + fd_budget.FDS_SPARE + fd_budget.FDS_PER_RANK // 2   # short of one rank's files
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
    try:
        notebook_launcher(os.getpid, num_processes={n}, ui="none", log_dir=sys.argv[1] + "/run")
        outcome = {{"error": None}}
    except LaunchArgumentError as exc:
        outcome = {{"error": type(exc).__name__, "message": str(exc)}}
    outcome["limit"] = limit
    outcome["one_rank"] = open_now + fd_budget.FDS_SPARE + fd_budget.FDS_PER_RANK
    outcome["run_folder"] = os.path.exists(sys.argv[1] + "/run")
    print("OUTCOME " + json.dumps(outcome))
""")


def test_a_limit_too_tight_for_one_rank_says_what_it_is_and_how_to_raise_it(tmp_path):
    """Before: "Use at most 0 ranks here" (a fixed 64 spare, then max(0, ...)). Now the limit, what
    one rank needs and how to raise the hard limit; for 1 rank and for 3."""
    for n in (1, 3):
        proc = subprocess.run([sys.executable, "-c", TOO_TIGHT_FOR_ONE.format(n=n), str(tmp_path / str(n))],
                              capture_output=True, text=True, timeout=240)
        line = [x for x in proc.stdout.splitlines() if x.startswith("OUTCOME ")]
        assert line, proc.stdout + proc.stderr
        outcome = json.loads(line[-1][len("OUTCOME "):])
        message = outcome["message"]
        assert outcome["error"] == "LaunchArgumentError", outcome
        assert "at most 0" not in message.lower() and "Not even one rank fits" in message, message
        assert f"open-file limit is {outcome['limit']} (ulimit -n), hard limit {outcome['limit']}" in message
        assert f"so one rank needs {outcome['one_rank']}" in message
        assert "each rank needs 11" in message
        assert "ulimit -Hn" in message and "LimitNOFILE=" in message and "--ulimit nofile=" in message
        assert not outcome["run_folder"], "nothing may start"


def test_a_limit_that_fits_some_ranks_names_how_many(tmp_path):
    outcome, _ = run_case(tmp_path, soft=128, hard=128, n=40)
    assert "num_processes=40 needs about" in outcome["message"]
    assert "fit under it: use num_processes=" in outcome["message"], outcome["message"]
