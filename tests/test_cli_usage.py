"""CLI usage errors exit 2 with argparse's message, never a traceback or a 'machine fault'."""
import subprocess
import sys

import pytest


def cli(*args):
    return subprocess.run([sys.executable, "-m", "notebook_launch", *args], capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("args,message", [
    (("demo", "--ui", "bogus"), "argument --ui: invalid choice: 'bogus'"),
    (("test", "--timeout", "-5"), "argument --timeout: must be a number of seconds > 0"),
    (("test", "--timeout", "nan"), "argument --timeout: must be a number of seconds > 0"),
    (("demo", "--timeout", "0"), "argument --timeout: must be a number of seconds > 0"),
    (("test", "-n", "0"), "argument -n/--num-processes: must be a whole number >= 1"),
    (("test", "-n", "100000"), "num_processes=100000"),
])
def test_usage_errors_exit_2_with_argparse_message(args, message):
    proc = cli(*args)
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert "FAILED" not in proc.stdout and "notebook-launch env" not in proc.stdout
    assert proc.stderr.startswith("usage: notebook-launch")
