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


def option_blocks(help_text):
    """{option flags line: its help text} from argparse's --help output."""
    blocks, current = {}, None
    for line in help_text.split("options:", 1)[1].splitlines():
        if line.startswith("  -"):
            current = line.strip().split("  ")[0]
            blocks[current] = line
        elif current and line.startswith("    "):
            blocks[current] += " " + line.strip()
        else:
            current = None
    return blocks


def subcommands():
    from notebook_launch.cli import build_parser
    parser = build_parser()
    action = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    assert action.choices is not None   # a subparsers action's choices: {name: its parser}
    return sorted(action.choices)


def test_every_subcommand_is_listed_with_its_help():
    proc = cli("--help")
    assert proc.returncode == 0
    for name in subcommands():
        line = next((line for line in proc.stdout.splitlines() if line.strip().startswith(name + " ")), "")
        assert len(line.split()) > 1, f"{name} has no help line in:\n{proc.stdout}"


@pytest.mark.parametrize("command", subcommands())
def test_every_option_of_every_subcommand_says_its_default(command):
    proc = cli(command, "--help")
    assert proc.returncode == 0, proc.stderr
    blocks = option_blocks(proc.stdout)
    assert any(flags.startswith("-h") for flags in blocks)
    for flags, text in blocks.items():
        if flags.startswith("-h"):
            continue
        assert "default" in text, f"`notebook-launch {command} {flags}` shows no default:\n{proc.stdout}"


def test_demo_help_shows_the_numbers_it_uses():
    blocks = option_blocks(cli("demo", "--help").stdout)
    assert "(default: 2)" in next(text for flags, text in blocks.items() if flags.startswith("-n"))
    assert "(default: 300)" in next(text for flags, text in blocks.items() if flags.startswith("--steps"))
    assert "(default: auto)" in next(text for flags, text in blocks.items() if flags.startswith("--ui"))
