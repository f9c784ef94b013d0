"""What a cell shows holds no frame or thread of notebook_launch (issue 35): one scan for every
output of a cell (streams, results, error tracebacks, the panel's HTML and its widgets' values),
used by each path a run ends through (launch, persistent call, magics, interrupt, timeout,
Stop, ``ranks.stacks()``). The logs keep our frames; the cell says how many it left out.

Ours are found three ways: a path into the package (``notebook_launch/rank/serve.py``), a frame
as a stack shows it (``interruptible() at serve.py:98``, ``launcher.py:123, in notebook_launcher``)
whose file is one of the package's and whose function is defined there, and the names of the
threads we start (``notebook_launch-progress``)."""
from __future__ import annotations

import ast
import html
import json
import os
import re
from functools import lru_cache
from typing import Any

import notebook_launch

ANSI = re.compile(r"\x1b\[[0-9;]*m")
PACKAGE_DIR = os.path.dirname(os.path.abspath(notebook_launch.__file__))
# a file of ours by its path (the log folder, ~/.cache/notebook_launch/runs/..., is a folder, not a .py)
OUR_PATH = re.compile(r"notebook_launch/[\w/]*\.py")
# frames as stacks and tracebacks write them: "f() at x.py:3", "x.py:3, in f", 'x.py", line 3, in f'
FRAME_AT = re.compile(r"\b(\w+)\(\) at (?:[\w./-]*/)?(\w+\.py)\b")
FRAME_IN = re.compile(r"\b(\w+\.py)(?::\d+|\"?, line \d+),? in (\w+)")
OUR_THREAD = re.compile(r"\bnotebook_launch-\w")


@lru_cache(maxsize=1)
def our_functions() -> frozenset[tuple[str, str]]:
    """(file name, function or class name) of every definition in the package."""
    found: set[tuple[str, str]] = set()
    for folder, _dirs, files in os.walk(PACKAGE_DIR):
        for name in files:
            if not name.endswith(".py"):
                continue
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                tree = ast.parse(f.read())
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    found.add((name, node.name))
    return frozenset(found)


def traces_of_ours(text: str) -> list[str]:
    """Every piece of ``text`` that is a frame, file or thread of notebook_launch."""
    text = ANSI.sub("", text)
    ours = our_functions()
    found = [m.group(0) for m in OUR_PATH.finditer(text)]
    found += [m.group(0) for m in FRAME_AT.finditer(text) if (m.group(2), m.group(1)) in ours]
    found += [m.group(0) for m in FRAME_IN.finditer(text) if (m.group(1), m.group(2)) in ours]
    found += [m.group(0) for m in OUR_THREAD.finditer(text)]
    return found


def everything_shown(cell: Any, notebook: Any = None) -> str:
    """All a cell showed: streams, every mime type of results and displays (the panel's final
    picture is its HTML), error names, values and tracebacks; with ``notebook``, the values of the
    widgets it stored (the live panel's HTML)."""
    parts: list[str] = []
    for out in cell.get("outputs", []):
        if out.output_type == "stream":
            parts.append(out.text)
        elif out.output_type in ("execute_result", "display_data"):
            for data in out.get("data", {}).values():
                parts.append(html.unescape(data if isinstance(data, str) else json.dumps(data)))
        elif out.output_type == "error":
            parts.append(f"{out.ename}: {out.evalue}\n" + "\n".join(out.traceback))
    if notebook is not None:
        widgets = notebook.metadata.get("widgets", {})
        parts.append(html.unescape(json.dumps(widgets)))
    return "\n".join(parts)


def assert_only_users_code(cell: Any, notebook: Any = None) -> str:
    """Fail naming what of ours the cell showed; return its text (ANSI codes removed)."""
    text = ANSI.sub("", everything_shown(cell, notebook))
    ours = traces_of_ours(text)
    assert not ours, f"the cell shows notebook_launch's own frames or threads: {ours}\n{text}"
    return text
