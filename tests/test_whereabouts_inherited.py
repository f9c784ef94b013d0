"""A rank says where it is even when the process that forked it had a whereabouts record of its
own (issue 20), and when it holds other memfds of the same names: a process that ran rank code
itself (a test that calls a rank hook in-process, a persistent rank that launches, anything
that called ``whereabouts.install``) hands its record and
stacks memfd to every child it forks, and that record names the parent's pid. The child must
install its own, or the notebook finds no record for it and a hang's error can only say
"ranks still running".

Each case runs in a fresh interpreter, so that this test process keeps no record of its own.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

SCRIPT = textwrap.dedent("""
    import os, sys, time
    from notebook_launch import LaunchError, notebook_launcher
    from notebook_launch.rank.reports import whereabouts

    def sleeps_on_rank_1():
        if int(os.environ["RANK"]) == 1:
            time.sleep(600)
        return 0

    if sys.argv[1] in ("installed", "installing"):
        whereabouts.install(None)   # this process now has a record, as a rank would
        assert whereabouts._record is not None
    if sys.argv[1] == "installing":   # another thread of the forker is inside install at each fork
        from helpers.forking import hold_in_another_thread
        hold_in_another_thread(whereabouts._install_lock, 600)
    if sys.argv[1] == "foreign":   # memfds of the same names that are not whereabouts' own (its module
        held = [whereabouts.Record(), os.memfd_create(whereabouts.STACKS_NAME)]   # knows nothing of them)
        held[0].announce()
        assert whereabouts._record is None
    try:
        notebook_launcher(sleeps_on_rank_1, num_processes=2, timeout=8, log_dir=sys.argv[2], ui="text")
    except LaunchError as error:
        print("FIRST-LINE:", str(error).splitlines()[0])
        print("WHOLE:", str(error))
""")


def run_case(mode: str, log_dir: str) -> str:
    script = os.path.join(os.path.dirname(log_dir), "launch_case.py")
    with open(script, "w") as f:
        f.write(SCRIPT)
    done = subprocess.run([sys.executable, script, mode, log_dir], cwd=REPO, capture_output=True,
                          # helpers.forking, and this checkout's package (not another one installed)
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([HERE, REPO])},
                          text=True, timeout=240)
    first = [line for line in done.stdout.splitlines() if line.startswith("FIRST-LINE:")]
    assert first, done.stdout + done.stderr
    return first[0].removeprefix("FIRST-LINE: ") + "\n" + done.stdout


def test_a_rank_forked_from_a_process_with_a_record_keeps_its_own(log_dir):
    text = run_case("installed", log_dir)
    first = text.splitlines()[0]
    assert first.startswith("notebook_launch: timed out after 8 s: "), text
    assert "rank 1 is in sleeps_on_rank_1() at launch_case.py:" in first and "(time.sleep(600))" in first, text


def test_a_rank_forked_while_another_thread_installs_does_not_wait_for_it(log_dir):
    """XLA runs its replicas as threads of one process, each calling install: a child forked while
    one of them held the install lock (a DataLoader worker) inherits the lock held by a thread it
    does not have, and its own install waited forever; each child gets a new lock."""
    text = run_case("installing", log_dir)
    first = text.splitlines()[0]
    assert first.startswith("notebook_launch: timed out after 8 s: "), text
    assert "rank 1 is in sleeps_on_rank_1() at launch_case.py:" in first and "(time.sleep(600))" in first, text


def test_a_rank_holding_another_processs_memfds_of_the_same_names_reads_its_own(log_dir):
    """Seen in CI: after the Ray tests, the test process held a record and stacks memfd of the
    same names (the module did not know of them), every forked rank inherited them beside its own,
    and the notebook, going by the name, read the forker's record: 'ranks still running'."""
    text = run_case("foreign", log_dir)
    first = text.splitlines()[0]
    assert first.startswith("notebook_launch: timed out after 8 s: "), text
    assert "rank 1 is in sleeps_on_rank_1() at launch_case.py:" in first and "(time.sleep(600))" in first, text


def test_the_same_launch_from_a_clean_process_says_the_same(log_dir):
    """The control: the verdict does not depend on the parent's record."""
    text = run_case("clean", log_dir)
    first = text.splitlines()[0]
    assert "rank 1 is in sleeps_on_rank_1() at launch_case.py:" in first, text
