"""``%ranks`` and ``%%ranks``: persistent ranks from IPython.

    %ranks start -n 4 [--spawn] [--mixed-precision bf16] [--timeout S] [--ui ...] [--port P] [--log-dir D]
                 [--grace S] [--stall-after S|none] [--lines-per-second N|all] [--cluster ADDRESS]
                               <- --spawn: fresh interpreters (after CUDA was initialized here);
                                  --cluster: Ray actors on the cluster at ADDRESS (RayCluster)
    %%ranks [--timeout S] [--ranks R,R] [--stall-after S|none] [--lines-per-second N|all]
                               <- the body runs on every rank (or those given), in the
                               ranks' persistent namespace; a last line that is an expression
                               shows each rank's value, tagged [rank N]
    %ranks push NAME [NAME...] <- the notebook's values of these names, into every rank
    %ranks pull NAME [NAME...] <- every rank's value (a list, in rank order)
    %ranks stacks              <- where every rank is now (during a call run elsewhere, or between calls)
    %ranks stop                (also: %ranks status)

A cell's body sees the notebook's current values of the globals it names, except
names the ranks assigned themselves (theirs win; see ``rank.namespace``).
"""
from __future__ import annotations

import argparse
import logging
import shlex
from typing import Any

from ..errors import LaunchArgumentError
from .launch import cell_filename, check_cell_syntax, referenced_globals
from .options import (NOT_WATCHED, MagicArgumentParser, options_parser, parse_lines_per_second,
                             parse_stall_after, parse_timeout, seconds_option, watch_options)
from ..rank.namespace import NotRun
from ..persistent.pool import DEFAULT_GRACE, Ranks, newest_open_pool
from ..ranks import start_ranks

log = logging.getLogger("notebook_launch")
USAGE = ("%ranks start [-n N] [--spawn] [--mixed-precision no|fp16|bf16|fp8] [--timeout S] "
         "[--ui auto|widget|html|rich|text|none] [--port PORT] [--log-dir DIR] [--display-ranks all|R,R] "
         "[--grace S] [--stall-after S|none] [--lines-per-second N|all] [--cluster ADDRESS] | "
         "%ranks push NAME... | %ranks pull NAME... | %ranks stacks | %ranks stop | %ranks status | "
         "%%ranks [--timeout S] [--ranks R,R] [--stall-after S] [--lines-per-second N|all]")
_NOTEBOOK_ONLY = frozenset({"In", "Out", "get_ipython", "exit", "quit"})
_active: Ranks | None = None


def _start_parser() -> argparse.ArgumentParser:
    p = options_parser("%ranks start", USAGE)
    p.add_argument("--grace", type=seconds_option("--grace"), default=DEFAULT_GRACE)
    p.add_argument("--spawn", action="store_true")
    p.add_argument("--cluster", default=None)
    return p


def _cell_parser() -> argparse.ArgumentParser:
    p = MagicArgumentParser(prog="%%ranks", add_help=False, usage=USAGE)
    p.add_argument("--timeout", type=parse_timeout, default=None)
    p.add_argument("--ranks", type=_rank_list, default=None)
    p.add_argument("--stall-after", type=parse_stall_after, default=None)
    p.add_argument("--lines-per-second", type=parse_lines_per_second, default=None)
    return p


def _rank_list(text: str) -> list[int]:
    """``0,2``: the global ranks a cell runs on (the pool checks they exist)."""
    try:
        chosen = [int(word) for word in text.split(",") if word.strip()]
    except ValueError:
        chosen = []
    if not chosen:
        raise argparse.ArgumentTypeError(f"--ranks takes global ranks separated by commas such as 0,2; got {text!r}")
    return chosen


def active() -> Ranks:
    """The ranks ``%ranks start`` made, else the newest ones ``start_ranks()`` made that still run
    (an error that says what to do if there are none)."""
    if _active is not None and not _active.closed:
        return _active
    pool = newest_open_pool()
    if pool is None:
        raise LaunchArgumentError("no ranks are running: start them with %ranks start -n N (or start_ranks())")
    return pool


def ranks_magic(shell: Any, line: str, cell: str | None = None) -> Any:
    """Dispatch ``%ranks ...`` (line) and ``%%ranks`` (cell)."""
    global _active
    try:
        words = shlex.split(line)
    except ValueError as exc:
        raise LaunchArgumentError(f"%ranks: cannot read the options ({exc}). Usage: {USAGE}") from None
    if cell is not None:
        options = _cell_parser().parse_args(words)
        if options.stall_after == NOT_WATCHED:
            raise LaunchArgumentError("%%ranks --stall-after takes seconds for this cell; to not watch for "
                                      "stalls at all, start the ranks with %ranks start --stall-after none")
        return run_cell(shell, active(), cell, options.timeout, options.ranks,
                        stall_after=options.stall_after, lines_per_second=options.lines_per_second)
    command, rest = (words[0], words[1:]) if words else ("status", [])
    if command == "start":
        if _active is not None and not _active.closed:
            raise LaunchArgumentError(f"%ranks start: ranks are already running ({_active!r}); "
                                      f"stop them first with %ranks stop")
        args = _start_parser().parse_args(rest)
        kwargs: dict[str, Any] = {"num_processes": args.num_processes, "mixed_precision": args.mixed_precision,
                                  "timeout": args.timeout, "ui": args.ui, "log_dir": args.log_dir,
                                  "interrupt_grace": args.grace, "display_ranks": args.display_ranks,
                                  "start_method": "spawn" if args.spawn else None, **watch_options(args)}
        if args.port is not None:
            kwargs["use_port"] = args.port
        if args.cluster is not None:
            if args.spawn:
                raise LaunchArgumentError("%ranks start: --spawn and --cluster do not go together (Ray starts "
                                          "the ranks on the cluster). Usage: " + USAGE)
            from ..engines import RayCluster
            kwargs["cluster"] = RayCluster(address=args.cluster)
            del kwargs["start_method"]
        _active = start_ranks(**kwargs)
        return None
    if command == "stop":
        running = _active if _active is not None and not _active.closed else newest_open_pool()
        if running is not None:
            running.close()
        _active = None
        return None
    if command == "stacks":
        print(active().stacks(), flush=True)
        return None
    if command == "status":
        running = _active if _active is not None and not _active.closed else newest_open_pool()
        print(repr(running) if running is not None else "no ranks are running (%ranks start -n N)")
        return None
    if command in ("push", "pull"):
        names = [n.strip() for word in rest for n in word.split(",") if n.strip()]
        if not names:
            raise LaunchArgumentError(f"%ranks {command} takes variable names. Usage: {USAGE}")
        if command == "pull":
            return active().pull(*names)
        namespace = shell.user_ns if shell is not None else {}
        missing = [n for n in names if n not in namespace]
        if missing:
            raise LaunchArgumentError(f"%ranks push: not defined in the notebook: {', '.join(missing)}")
        active().push(**{n: namespace[n] for n in names})
        return None
    raise LaunchArgumentError(f"%ranks: unknown command {command!r}. Usage: {USAGE}")


def run_cell(shell: Any, ranks: Ranks, cell: str, timeout: float | None, subset: list[int] | None = None, *,
             stall_after: float | None = None, lines_per_second: int | str | None = None) -> None:
    """Run the cell on every rank (or on ``subset``) with the notebook values it names (those
    that pickle), then show each rank's value of its last line as IPython shows a cell's result."""
    source = shell.transform_cell(cell) if shell is not None else cell
    filename = cell_filename(shell, source, cell) if shell is not None else "<%%ranks cell>"
    code = compile(source, filename, "exec")   # a syntax error shows here, before any rank runs it
    values = shippable(referenced_globals(code, shell.user_ns)) if shell is not None else {}
    results = ranks.run_cell(source, filename, values, timeout=timeout, ranks=subset, stall_after=stall_after,
                             lines_per_second=lines_per_second)
    show_values(shell, results)


def show_values(shell: Any, results: list[Any]) -> None:
    """One ``[rank N]`` entry per rank whose cell had a value (None and ranks that did not run
    show nothing, as IPython shows no None): text on one line with its tag; a rich value (HTML,
    an image) under a tag line of its own."""
    from IPython.display import display
    for rank, value in enumerate(results):
        if value is None or value is NotRun:
            continue
        tag = f"[rank {rank}]"
        formatter = getattr(shell, "display_formatter", None)
        if formatter is None:
            print(f"{tag} {value!r}", flush=True)
            continue
        bundle, metadata = formatter.format(value)
        text = bundle.get("text/plain", repr(value))
        if set(bundle) <= {"text/plain"}:
            display({"text/plain": f"{tag}\n{text}" if "\n" in text else f"{tag} {text}"}, raw=True)
        else:
            display({"text/plain": tag, "text/html": f"<pre>{tag}</pre>"}, raw=True)
            display(bundle, raw=True, metadata=metadata)


def shippable(values: dict[str, Any]) -> dict[str, Any]:
    """Leave out what only the notebook has (IPython's own names, the ranks handle). Values
    that do not pickle stay: ``Ranks.run_cell`` names them before running and sends the rest."""
    return {name: value for name, value in values.items()
            if name not in _NOTEBOOK_ONLY and not isinstance(value, Ranks)}


def register(ipython: Any) -> None:
    """Add ``%ranks`` / ``%%ranks`` to IPython."""
    def ranks(line: str, cell: str | None = None) -> Any:
        return ranks_magic(ipython, line, cell)

    ranks.__doc__ = f"Persistent ranks.\n\nUsage: {USAGE}"
    ipython.register_magic_function(ranks, magic_kind="line_cell", magic_name="ranks")
    check_cell_syntax(ipython, "ranks")
