"""NOTEBOOK_LAUNCH_DEBUG=1 shows the fallbacks the package takes (debug level, on stderr)."""
from __future__ import annotations

import os
import subprocess
import sys

SCRIPT = ("import logging, notebook_launch\n"
          "notebook_launch.install_hooks()   # what %load_ext and the first launch do\n"
          "from notebook_launch.planning.net import ipv4_of\n"
          "print(logging.getLogger('notebook_launch').getEffectiveLevel())\n"
          "print(ipv4_of('no-such-host.invalid'))\n")


def run(debug: str | None, script: str = SCRIPT) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "NOTEBOOK_LAUNCH_DEBUG"}
    if debug is not None:
        env["NOTEBOOK_LAUNCH_DEBUG"] = debug
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)


def test_debug_variable_turns_on_fallback_logging():
    proc = run("1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["10", "None"]   # logging.DEBUG; the fallback's answer
    assert "no-such-host.invalid does not resolve to an IPv4 address" in proc.stderr


def test_without_the_variable_fallbacks_stay_quiet():
    proc = run(None)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[1] == "None"
    assert "does not resolve" not in proc.stderr


def test_importing_alone_configures_no_logging_even_with_the_variable():
    """A library import changes nothing (issue 21): the handler comes with the hooks."""
    proc = run("1", "import logging, notebook_launch\n"
                    "logger = logging.getLogger('notebook_launch')\n"
                    "print(logger.level, len(logger.handlers), len(logging.getLogger().handlers))\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["0", "0", "0"]


def test_a_spawned_rank_logs_at_debug_level_too():
    """A forked rank inherits the notebook's handler; a spawned one is a fresh interpreter that
    inherits only the variable, so it turns the logging on itself (rank.spawn_entry)."""
    script = ("import logging, notebook_launch\n"
              "from notebook_launch import notebook_launcher\n"
              "def level():\n"
              "    import logging\n"
              "    logger = logging.getLogger('notebook_launch')\n"
              "    return logger.getEffectiveLevel(), len(logger.handlers)\n"
              "print(notebook_launcher(level, num_processes=1, start_method='spawn', ui='none'))\n")
    proc = run("1", script)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[(10, 1)]", proc.stdout
    quiet = run(None, script)
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stdout.strip().splitlines()[-1] == "[(30, 0)]", quiet.stdout
