"""Remember where CUDA was first initialized in this process, so the guard that
refuses to fork after CUDA init can say which line or cell did it.

Two witnesses: a wrapper around ``torch.cuda._lazy_init`` (records the Python
stack of the first initialization after notebook_launch is imported), and an
IPython post-run-cell hook (records the first cell after which CUDA was
initialized, which also catches initializations the wrapper cannot see).
"""
from __future__ import annotations

import logging
import re
import sys
import traceback
from typing import Any

log = logging.getLogger("notebook_launch")
_first_init_stack: list | None = None
_first_cell: tuple | None = None    # (execution_count, first lines of the cell)
_installed = False


def install() -> None:
    """Idempotent. Called when notebook_launch is imported (and by %load_ext)."""
    global _installed
    if _installed:
        return
    _installed = True
    _wrap_lazy_init()
    _register_ipython_hook()


def _wrap_lazy_init() -> None:
    torch = sys.modules.get("torch")
    if torch is None:
        return
    cuda = torch.cuda
    original = cuda._lazy_init
    if getattr(original, "_notebook_launch_wrapped", False):
        return

    def _lazy_init(*args: Any, **kwargs: Any) -> Any:
        global _first_init_stack
        if _first_init_stack is None and not cuda.is_initialized():
            _first_init_stack = traceback.extract_stack()[:-1]
        return original(*args, **kwargs)

    _lazy_init._notebook_launch_wrapped = True  # type: ignore[attr-defined]
    cuda._lazy_init = _lazy_init


def _register_ipython_hook() -> None:
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is None:
        return

    def _after_cell(result: Any) -> None:
        global _first_cell
        torch = sys.modules.get("torch")
        if _first_cell is None and torch is not None and is_cuda_initialized():
            info = getattr(result, "info", None)
            source = getattr(info, "raw_cell", "") or ""
            _first_cell = (getattr(result, "execution_count", None), likely_culprits(source))

    shell.events.register("post_run_cell", _after_cell)


_CUDA_HINT = re.compile(r"cuda|\.to\(|device|Accelerator|PartialState", re.IGNORECASE)


def likely_culprits(source: str, limit: int = 3) -> list[str]:
    """The lines of a cell most likely to have touched CUDA, else its first lines."""
    lines = [line for line in source.strip().splitlines() if line.strip()]
    hits = [line for line in lines if _CUDA_HINT.search(line)]
    return (hits or lines)[:limit]


def is_cuda_initialized() -> bool:
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        return bool(torch.cuda.is_initialized())
    except Exception:
        log.debug("torch.cuda.is_initialized() failed; assuming CUDA is not initialized", exc_info=True)
        return False


def where() -> str:
    """Human description of where CUDA was first initialized, or '' if unknown."""
    parts = []
    if _first_init_stack:
        user_frames = [f for f in _first_init_stack if not _is_library_frame(f.filename)]
        frames = user_frames[-3:] or _first_init_stack[-3:]
        parts.append("CUDA was first initialized at:\n" + "".join(traceback.format_list(frames)).rstrip())
    if _first_cell is not None:
        count, lines = _first_cell
        snippet = "\n".join("    " + line for line in lines)
        parts.append(f"CUDA was already initialized after running cell [{count}]:\n{snippet}")
    return "\n".join(parts)


def _is_library_frame(filename: str) -> bool:
    return any(marker in filename for marker in ("site-packages", "dist-packages", "/torch/",
                                                 "notebook_launch", "IPython", "ipykernel",
                                                 "<frozen", "/lib/python3"))


def _reset_for_tests() -> None:
    global _first_init_stack, _first_cell
    _first_init_stack = None
    _first_cell = None
