"""mkdocs hooks (mkdocs.yml `hooks:`): pages that show what the code produces, at build time.

The Commands page shows ``notebook-launch --help`` and each command's ``--help`` as the installed CLI
prints them (``<!-- CLI-HELP -->``), so its options and defaults are never copied by hand.

The Accelerate guide shows ``plan.ACCELERATE_VARIABLE_DIFFERENCES`` (``<!-- ACCELERATE-VARIABLES -->``):
where a rank's environment differs from what Accelerate's launcher gives, read from the code.

The Benchmarks page shows the plots benchmarks/run.py drew.

benchmarks/run.py writes its SVG plots into docs/images/benchmarks/ from the same run as its table. The
page marks their place with ``<!-- PLOTS -->``; at build time that marker becomes one image per SVG
found there (sorted by name), or a line saying no plots were drawn yet, so the page never links to a
file that is not there (``mkdocs build --strict`` would fail on it) and a new plot needs no page edit.
"""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

MARKER = "<!-- PLOTS -->"
PLOTS = Path("images") / "benchmarks"
TITLES = {
    "launch_cost": "Launch cost of a trivial function against rank count",
    "first_step": "Time to the first trained DDP step against rank count",
    "result_transfer": "A rank returns a state_dict: time against size, with the memcpy floor",
    "soak": "Soak (item 14): what a long, loud run leaves, over time",
}


CLI_MARKER = "<!-- CLI-HELP -->"


# Run in one child process (one import of notebook_launch, and so of torch): every command's --help.
_HELP_PROGRAM = r"""
import contextlib, io, json, re, sys
from notebook_launch.__main__ import main

def text(args):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            main(args + ["--help"])
        except SystemExit:
            pass
    return out.getvalue().rstrip()

top = text([])
found = re.search(r"\{([\w,-]+)\}", top)
commands = found.group(1).split(",") if found else []
json.dump([["", top]] + [[command, text([command])] for command in commands], sys.stdout)
"""


def cli_help() -> str:
    """The top-level help, then one section per command its usage line names."""
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, COLUMNS="100", PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", _HELP_PROGRAM], cwd=root, env=env, capture_output=True,
                          text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"notebook-launch --help failed:\n{done.stdout}{done.stderr}")
    parts = []
    for command, text in json.loads(done.stdout):
        heading = f"## notebook-launch {command}\n\n" if command else ""
        parts.append(f"{heading}```text\n{text}\n```\n")
    return "\n".join(parts)


ACCELERATE_MARKER = "<!-- ACCELERATE-VARIABLES -->"


def accelerate_variables() -> str:
    """``notebook_launch/wire/plan.py``'s ACCELERATE_VARIABLE_DIFFERENCES as a table, read from the source
    (a literal: nothing is imported)."""
    plan = Path(__file__).resolve().parent.parent / "notebook_launch" / "wire" / "plan.py"
    source = plan.read_text(encoding="utf-8")
    for node in ast.parse(source).body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "ACCELERATE_VARIABLE_DIFFERENCES" for t in targets):
                assert node.value is not None
                rows = ast.literal_eval(node.value)
                break
    else:
        raise RuntimeError("notebook_launch/wire/plan.py has no ACCELERATE_VARIABLE_DIFFERENCES")

    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    lines = ["| variable | Accelerate's `notebook_launcher` | notebook_launch | why |", "|---|---|---|---|"]
    for variable, theirs, ours, why in rows:
        names = ", ".join(f"`{name.strip()}`" for name in variable.split(","))
        lines.append(f"| {names} | {cell(theirs)} | {cell(ours)} | {cell(why)} |")
    return "\n".join(lines) + "\n"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if ACCELERATE_MARKER in markdown:
        markdown = markdown.replace(ACCELERATE_MARKER, accelerate_variables())
    if CLI_MARKER in markdown:
        markdown = markdown.replace(CLI_MARKER, cli_help())
    if MARKER not in markdown:
        return markdown
    folder = Path(config["docs_dir"]) / PLOTS
    known = list(TITLES)
    plots = sorted(folder.glob("*.svg") if folder.is_dir() else [],
                   key=lambda plot: (known.index(plot.stem) if plot.stem in known else len(known), plot.name))
    page_dir = Path(page.file.src_uri).parent
    if not plots:
        text = ("*No plots yet: `benchmarks/run.py` draws them into `docs/images/benchmarks/` "
                "from the run that writes the table.*")
    else:
        blocks = []
        for plot in plots:
            title = TITLES.get(plot.stem, plot.stem.replace("_", " "))
            rel = Path(*([".."] * len(page_dir.parts)), PLOTS, plot.name).as_posix()
            blocks.append(f"### {title}\n\n![{title}]({rel})\n")
        text = ("## Plots\n\nDrawn by `benchmarks/run.py` (`--plots`, default `docs/images/benchmarks/`) from the run "
                "that wrote its table; each plot's caption names that run's machine and date, which may differ "
                "from the table below (`benchmarks/RESULTS.md` says when it was written).\n\n" + "\n".join(blocks))
    return markdown.replace(MARKER, text)
