"""Print the packages of pyproject's test extra that this Python does not have, one a line (nothing when all are
there); exit 0 either way.

scripts/test-quick.sh asks this before it starts: a .venv made by scripts/quickstart.sh holds only what
notebook_launch needs at run time, and the quick loop then failed at once with raw errors ("No module named
pytest", ".venv/bin/ruff: No such file or directory") instead of saying the one command that adds them. Run
with the venv's Python: ``.venv/bin/python scripts/missing_test_tools.py [pyproject.toml]``. Only the names are
compared (an installed package at another version counts as there: pip's resolver decided it).
"""
from __future__ import annotations

import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path


def test_extra(pyproject_text: str) -> list[str]:
    """The distribution names the test extra lists, as written ("pytest-xdist", "ray" from "ray[train]==...")."""
    extra = tomllib.loads(pyproject_text)["project"]["optional-dependencies"]["test"]
    return [re.split(r"[\s\[<>=!~;@]", requirement.strip(), maxsplit=1)[0] for requirement in extra]


def missing(names: list[str]) -> list[str]:
    """The names of ``names`` not installed for this interpreter."""
    absent = []
    for name in names:
        try:
            importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            absent.append(name)
    return absent


def main(argv: list[str]) -> int:
    pyproject = Path(argv[0]) if argv else Path(__file__).resolve().parent.parent / "pyproject.toml"
    for name in missing(test_extra(pyproject.read_text(encoding="utf-8"))):
        print(name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
