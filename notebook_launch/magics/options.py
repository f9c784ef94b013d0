"""What the notebook's two magics share (``%%launch`` in ``magics.launch``, ``%ranks``/``%%ranks`` in
``magics.ranks``): an argparse parser that raises instead of exiting, the options both
take, and the value types of those options. One home, so neither magic reads the other's
private names."""
from __future__ import annotations

import argparse
from typing import Any, Callable, NoReturn

from ..errors import LaunchArgumentError

NOT_WATCHED = "none"   # --stall-after none: stall_after=None


class MagicArgumentParser(argparse.ArgumentParser):
    """argparse would call sys.exit on bad options, which a kernel turns into noise: raise
    LaunchArgumentError naming the magic (``prog``) and its usage instead."""

    def error(self, message: str) -> NoReturn:
        raise LaunchArgumentError(f"{self.prog}: {message}. Usage: {self.usage}")


def options_parser(prog: str, usage: str) -> argparse.ArgumentParser:
    """The options %%launch and %ranks start share with notebook_launcher."""
    p = MagicArgumentParser(prog=prog, add_help=False, usage=usage)
    p.add_argument("-n", "--num-processes", type=whole_number("-n/--num-processes"), default=None)
    p.add_argument("--mixed-precision", default="no")
    p.add_argument("--timeout", type=parse_timeout, default=None)
    p.add_argument("--ui", default="auto")
    p.add_argument("--port", default=None)
    p.add_argument("--log-dir", default=None)
    p.add_argument("--display-ranks", type=parse_display_ranks, default=None)
    p.add_argument("--stall-after", type=parse_stall_after, default=None)
    p.add_argument("--lines-per-second", type=parse_lines_per_second, default=None)
    return p


def watch_options(args: argparse.Namespace) -> dict[str, Any]:
    """``stall_after`` / ``lines_per_second`` keyword arguments for the options given (none:
    the function's defaults apply)."""
    options: dict[str, Any] = {}
    if args.stall_after is not None:
        options["stall_after"] = None if args.stall_after == NOT_WATCHED else args.stall_after
    if args.lines_per_second is not None:
        options["lines_per_second"] = args.lines_per_second
    return options


def parse_stall_after(text: str) -> float | str:
    """``--stall-after``: seconds, or ``none`` (not watched); notebook_launcher checks they are > 0."""
    if text.strip().lower() in (NOT_WATCHED, "off"):
        return NOT_WATCHED
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--stall-after must be a number of seconds, or none to not watch for stalls; got {text!r}") from None


def parse_lines_per_second(text: str) -> int | str:
    """``--lines-per-second``: a whole number of lines a second, or ``all``; notebook_launcher
    checks it is >= 1."""
    if text.strip() == "all":
        return "all"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--lines-per-second must be a whole number of lines a second, or all; got {text!r}") from None


def parse_display_ranks(text: str) -> str | list[int]:
    """``--display-ranks``: ``all`` or ranks separated by commas (``0,1``); the options module
    checks the ranks."""
    if text.strip() == "all":
        return "all"
    try:
        return [int(word) for word in text.split(",") if word.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--display-ranks takes 'all' or ranks separated by commas such as 0,1; got {text!r}") from None


def whole_number(option: str) -> Callable[[str], int]:
    """An argparse type for ``option``'s whole number; the function it feeds checks its range."""
    def parse(text: str) -> int:
        try:
            return int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{option} must be a whole number, got {text!r}") from None
    return parse


def seconds_option(option: str) -> Callable[[str], float]:
    """An argparse type for ``option``'s seconds; the function it feeds checks their range."""
    def parse(text: str) -> float:
        try:
            return float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{option} must be a number of seconds, got {text!r}") from None
    return parse


parse_timeout = seconds_option("--timeout")
