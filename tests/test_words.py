"""Words a person reads after a run (issue 44, part 5): "1 ranks finished", "within 3 s of the
interrupt after an interrupt", "interrupted after an interrupt", and the user's own exception (an
alarm handler's) called "an interrupt"."""
from __future__ import annotations

import subprocess
import sys
import textwrap

from notebook_launch import notebook_launcher, start_ranks
from notebook_launch.display.words import counted
from notebook_launch.supervise import outcome


def test_counts_read_as_a_person_writes_them():
    assert counted(1, "rank") == "1 rank" and counted(2, "rank") == "2 ranks" and counted(0, "call") == "0 calls"
    assert counted(1, "process", "processes") == "1 process" and counted(3, "process", "processes") == "3 processes"


def test_one_rank_finished_and_returned(capsys, tmp_path):
    notebook_launcher(print, num_processes=1, ui="text", log_dir=str(tmp_path / "launch"))
    with start_ranks(1, ui="text", log_dir=str(tmp_path / "ranks")) as ranks:
        ranks.run(print)
        assert "<Ranks: 1 rank " in repr(ranks) and ", 1 call," in repr(ranks), repr(ranks)
    out = capsys.readouterr().out
    assert "1 rank finished in" in out and "1 rank returned in" in out, out
    assert "1 ranks" not in out and "1 calls" not in out, out


def test_an_interrupt_is_said_once():
    text = outcome.ranks_not_back([1], 3, outcome.INTERRUPT)
    assert text.startswith("rank 1 did not come back within 3 s of the interrupt (code waiting"), text
    assert "of the interrupt after the timeout (" in outcome.ranks_not_back([1], 3, "the timeout")
    assert outcome.after(outcome.INTERRUPT, "interrupted") == "interrupted"
    assert outcome.after("the Stop button", "interrupted") == "interrupted after the Stop button"


def test_what_stopped_the_wait_is_named_as_itself():
    assert outcome.stop_cause(KeyboardInterrupt()) == outcome.INTERRUPT
    assert outcome.stop_cause(TimeoutError()) == "TimeoutError raised in the notebook"
    assert outcome.stop_cause(SystemExit(0)) == "sys.exit() in the notebook"


ALARM = textwrap.dedent("""
    import signal, sys
    from notebook_launch import notebook_launcher

    class Deadline(Exception):
        pass

    def on_alarm(signum, frame):
        raise Deadline("my own deadline")

    def slow():
        import time
        time.sleep(60)

    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, 3)
    try:
        notebook_launcher(slow, num_processes=2, ui="text", log_dir=sys.argv[1])
    except Deadline as exc:
        print("CAUGHT", exc)
""")


def test_the_users_own_alarm_exception_is_not_called_an_interrupt(tmp_path):
    done = subprocess.run([sys.executable, "-c", ALARM, str(tmp_path)], capture_output=True, text=True,
                          timeout=120)
    out = done.stdout + done.stderr
    assert "CAUGHT my own deadline" in out, out
    assert "Deadline raised in the notebook" in out, out
    assert "an interrupt" not in out and "interrupted" not in out, out
