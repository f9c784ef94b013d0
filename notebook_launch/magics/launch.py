"""IPython extension: ``%load_ext notebook_launch`` and the ``%%launch`` cell magic.

    %%launch -n 4 --return model_state,losses
    <the cell body runs on 4 ranks>

The body runs in every rank with the notebook's globals (fork copies them; with
``--start-method spawn`` the globals the body names travel by cloudpickle), through
``notebook_launcher``: same guards, panel and LaunchError. Rank 0's values of the
``--return`` names are assigned in the notebook afterwards.
"""
from __future__ import annotations

import argparse
import os
import shlex
import types
from typing import Any, Iterable

from ..errors import LaunchArgumentError
from ..errors.render import remember_cell
from ..errors.ipython_shell import running_shell
from .options import options_parser, watch_options

USAGE = ("%%launch [-n N] [--mixed-precision no|fp16|bf16|fp8] [--timeout SECONDS] "
         "[--start-method fork|spawn] [--ui auto|widget|html|rich|text|none] [--port PORT] "
         "[--log-dir DIR] [--display-ranks all|R,R] [--stall-after SECONDS|none] [--lines-per-second N|all] "
         "[--return NAME[,NAME...]]")


def _parser() -> argparse.ArgumentParser:
    p = options_parser("%%launch", USAGE)
    p.add_argument("--start-method", default=None)
    p.add_argument("--return", dest="return_names", action="extend", nargs="+", default=[])
    return p


def parse_launch_line(line: str) -> dict[str, Any]:
    """The magic's options as notebook_launcher keyword arguments, plus ``return_names``."""
    try:
        words = shlex.split(line)
    except ValueError as exc:
        raise LaunchArgumentError(f"%%launch: cannot read the options ({exc}). Usage: {USAGE}") from None
    args = _parser().parse_args(words)
    names = [n.strip() for group in args.return_names for n in group.split(",") if n.strip()]
    bad = [n for n in names if not n.isidentifier()]
    if bad:
        raise LaunchArgumentError(
            f"%%launch: --return takes variable names separated by commas; not names: "
            f"{', '.join(map(repr, bad))}. Usage: {USAGE}")
    options = {"num_processes": args.num_processes, "mixed_precision": args.mixed_precision,
               "timeout": args.timeout, "start_method": args.start_method, "ui": args.ui,
               "log_dir": args.log_dir, "display_ranks": args.display_ranks, "return_names": tuple(names),
               **watch_options(args)}
    if args.port is not None:
        options["use_port"] = args.port
    return options


class CellJob:
    """The callable each rank runs: the cell's code in the notebook's namespace.

    ``namespace`` None means "the IPython user namespace of this process", which a
    forked rank has as a copy. A spawned rank receives the referenced globals instead.
    """

    def __init__(self, source: str, filename: str, return_names: Iterable[str] = (),
                 namespace: dict[str, Any] | None = None) -> None:
        self.source = source
        self.filename = filename
        self.return_names = tuple(return_names)
        self.namespace = namespace

    def __call__(self) -> dict[str, Any] | None:
        ns = self.namespace
        if ns is None:
            shell = running_shell()
            ns = shell.user_ns if shell is not None else {"__name__": "__main__"}
        _remember_source(self.filename, self.source)
        exec(compile(self.source, self.filename, "exec"), ns)
        if not self.return_names or os.environ.get("RANK", "0") != "0":
            return None
        missing = [n for n in self.return_names if n not in ns]
        if missing:
            raise NameError(f"%%launch --return: the cell did not define {', '.join(missing)} on rank 0")
        return {n: ns[n] for n in self.return_names}


def _remember_source(filename: str, source: str) -> None:
    """Let tracebacks in the rank show the cell's lines."""
    import linecache
    if filename not in linecache.cache:
        lines = source.splitlines(keepends=True)
        linecache.cache[filename] = (len(source), None, lines, filename)


def referenced_globals(code: types.CodeType, user_ns: dict[str, Any]) -> dict[str, Any]:
    """The notebook globals a cell's code names (recursively through nested code), for spawn."""
    names: set[str] = set()
    stack = [code]
    while stack:
        current = stack.pop()
        names.update(current.co_names)
        stack.extend(c for c in current.co_consts if isinstance(c, types.CodeType))
    return {n: user_ns[n] for n in names if n in user_ns and not n.startswith("_i")}


def launch_cell(shell: Any, line: str, cell: str) -> None:
    """Run ``cell`` on N ranks; assign rank 0's ``--return`` values in the notebook."""
    from ..launcher import notebook_launcher
    options = parse_launch_line(line)
    return_names = options.pop("return_names")
    source = shell.transform_cell(cell) if shell is not None else cell
    filename = cell_filename(shell, source, cell)
    code = compile(source, filename, "exec")  # a syntax error shows here, before any rank starts
    namespace = None
    if options.get("start_method") == "spawn" and shell is not None:
        namespace = referenced_globals(code, shell.user_ns)
        namespace.setdefault("__name__", "__main__")
    job = CellJob(source, filename, return_names, namespace)
    # None is "not given" except for stall_after, there only when given (--stall-after none: not watched)
    results = notebook_launcher(job, **{k: v for k, v in options.items() if v is not None or k == "stall_after"})
    if return_names and shell is not None:
        shell.user_ns.update(results[0] or {})
    return None


def cell_filename(shell: Any, source: str, raw: str, number: int | None = None) -> str:
    """IPython's own cell file name (the one its tracebacks show), registered in linecache, and
    its In[n] remembered for IPython 7, which keeps no map from names to numbers (errors/render.py).
    ``number``: the cell's In[n] where the caller knows it (before the cell runs)."""
    compiler = getattr(shell, "compile", None)
    if compiler is not None and hasattr(compiler, "cache"):
        number = _running_cell_number(shell, compiler) if number is None else number
        try:
            filename = str(compiler.cache(source, number, raw_code=raw))
        except TypeError:   # an IPython whose cache() takes no raw_code
            filename = str(compiler.cache(source, number))
        remember_cell(filename, number)
        return filename
    return "<%%launch cell>"


def _running_cell_number(shell: Any, compiler: Any) -> int:
    """The In[n] of the cell running now. IPython 9 counts ``execution_count`` up before the
    cell runs (older versions after), but the running cell is always the newest one cached;
    IPython 7 has no such map, and its ``execution_count`` is the running cell's."""
    numbers = getattr(compiler, "_filename_map", None)
    if numbers:
        return int(max(numbers.values()))
    return int(getattr(shell, "execution_count", 0))


class _CellSyntaxCheck:
    """An IPython input transformer (``input_transformers_cleanup``, which sees the cell as typed)
    that compiles the body of a ``%%launch`` / ``%%ranks`` cell before IPython runs the cell: a
    syntax error then shows as IPython shows one in any cell (the cell's line and a caret, no
    frames), not from inside the magic, where IPython would list its own frames and ours. The
    magics compile the body again (``launch_cell``): this is what a person sees, that the guard."""
    has_side_effects = True   # IPython's is-the-cell-complete check leaves it out (it only reads)

    def __init__(self, shell: Any) -> None:
        self.shell = shell
        self.magics: set[str] = set()

    def __call__(self, lines: list[str]) -> list[str]:
        first = lines[0].split(None, 1)[0] if lines and lines[0].strip() else ""
        if not first.startswith("%%") or first[2:] not in self.magics:
            return lines
        body = "".join(lines[1:])
        source = body
        try:
            source = self.shell.transform_cell(body)
            compile(source, "<cell>", "exec")
        except SyntaxError as error:
            # not run yet: the number IPython is about to give the cell (it caches cells under it)
            filename = cell_filename(self.shell, source, body, number=int(self.shell.execution_count))
            raise _in_file(error, filename) from None
        return lines


def _in_file(error: SyntaxError, filename: str) -> SyntaxError:
    """``error`` as compiling the cell's file gives it (IPython names the file ``Cell In[n]``)."""
    return type(error)(error.msg, (filename, error.lineno, error.offset, error.text,
                                   getattr(error, "end_lineno", None), getattr(error, "end_offset", None)))


def check_cell_syntax(shell: Any, magic_name: str) -> None:
    """Have ``%%<magic_name>`` cells' syntax errors shown as a cell's own (``_CellSyntaxCheck``)."""
    cleanup = getattr(shell, "input_transformers_cleanup", None)
    if cleanup is None:   # an IPython without it: the magic's own compile still stops the cell
        return
    check = next((t for t in cleanup if isinstance(t, _CellSyntaxCheck)), None)
    if check is None:
        check = _CellSyntaxCheck(shell)
        cleanup.append(check)
    check.magics.add(magic_name)


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext notebook_launch`` (or ``notebook_launch.magics.launch``): the hooks (``hooks``: where CUDA
    gets initialized, among others), then ``%%launch``."""
    from ..hooks import install
    install(by="%load_ext notebook_launch", shell=ipython)   # idempotent: the package's extension calls it too

    def launch(line: str, cell: str) -> None:
        return launch_cell(ipython, line, cell)

    launch.__doc__ = f"Run the cell on N ranks with notebook_launcher.\n\nUsage: {USAGE}"
    ipython.register_magic_function(launch, magic_kind="cell", magic_name="launch")
    check_cell_syntax(ipython, "launch")
