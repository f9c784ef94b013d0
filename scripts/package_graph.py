"""Print the package's layout as it is in the code: each package (each engine's folder on its own) and
the packages it imports, and a table of what each package owns and may import (its ``__init__``'s
docstring). docs/architecture.md shows this output; run it again when the layout changes:

    .venv/bin/python scripts/package_graph.py            # the text graph and the table (Markdown)
    .venv/bin/python scripts/package_graph.py --check    # exit 1 if docs/architecture.md shows another graph

The graph is the one tests/test_import_graph.py checks (imports inside functions count; those under
``TYPE_CHECKING`` do not), read without importing the package."""
from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "notebook_launch"
DOC = ROOT / "docs" / "architecture.md"
BEGIN, END = "<!-- package graph: begin -->", "<!-- package graph: end -->"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def unit_of(module: str) -> str:
    """A module's node: its package, or itself at the top. Under ``engines`` each engine's folder
    is one node (``engines.ray``), and so is the launcher interface (``engines.base``) apart from the
    chooser (``engines``, the package's ``__init__``); under ``rank`` each sub-package is one node
    (``rank.integrations``) apart from the rank's core (``rank``, the modules of the folder itself),
    so that the core reaching them only by name (``rank.installs``) is checked as every edge is."""
    parts = module.split(".")
    if len(parts) > 2 and parts[1] == "engines":
        return f"engines.{parts[2]}"
    if len(parts) > 2 and parts[1] == "rank" and (PACKAGE / "rank" / parts[2] / "__init__.py").exists():
        return f"rank.{parts[2]}"
    return parts[1] if len(parts) > 1 else "notebook_launch"


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(path: Path, modules: set[str], type_checking: bool = False) -> set[str]:
    """What ``path`` imports of ``modules`` (inside functions too); ``type_checking``: its
    ``TYPE_CHECKING`` imports as well. tests/test_import_graph.py reads the graph through here."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child) and not type_checking:
                for branch in child.orelse:
                    visit(branch)
                continue
            if isinstance(child, ast.Import):
                found.update(alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")
                    base = base[:len(base) - (child.level - 1)]
                    target = ".".join(base + ([child.module] if child.module else []))
                else:
                    target = child.module or ""
                for alias in child.names:
                    submodule = f"{target}.{alias.name}"
                    found.add(submodule if submodule in modules else target)
            visit(child)

    visit(ast.parse(path.read_text()))
    return {m for m in found if m in modules and m != name}


def package_edges() -> dict[str, set[str]]:
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    edges: dict[str, set[str]] = {}
    for path in paths:
        a = unit_of(module_name(path))
        edges.setdefault(a, set())
        for target in imports_of(path, modules):
            b = unit_of(target)
            if a != b:
                edges[a].add(b)
    return edges


def describe(unit: str) -> tuple[str, str]:
    """(what it owns, what it may import), from its ``__init__``'s docstring ("Owns: ... May import: ...")."""
    folder = PACKAGE / Path(*unit.split("."))
    init = folder / "__init__.py"
    if not init.exists():
        return ("(a module)", "")
    doc = " ".join((ast.get_docstring(ast.parse(init.read_text())) or "").split())
    owns, _, may = doc.partition("May import:")
    if "Owns:" in owns:
        owns = owns.split("Owns:", 1)[1]
    else:
        owns = owns.split(". ")[0]
    return owns.strip().rstrip("."), may.strip().rstrip(".")


def render() -> str:
    edges = package_edges()
    units = sorted(u for u in edges if u != "notebook_launch")
    width = max(map(len, units))
    lines = ["```text", "package".ljust(width) + "  imports"]
    for unit in units:
        lines.append(unit.ljust(width) + "  " + (", ".join(sorted(edges[unit] - {"notebook_launch"})) or "-"))
    lines += ["```", "", "| package | owns | may import |", "|---|---|---|"]
    for unit in units:
        if (PACKAGE / Path(*unit.split(".")) / "__init__.py").exists():
            owns, may = describe(unit)
            lines.append(f"| `{unit}` | {owns} | {may} |")
    return "\n".join(lines)


def main() -> int:
    text = render()
    if "--check" in sys.argv:
        doc = DOC.read_text()
        shown = doc.split(BEGIN, 1)[1].split(END, 1)[0].strip() if BEGIN in doc else ""
        if shown != text.strip():
            print(f"{DOC} shows another layout: run scripts/package_graph.py and paste its output", file=sys.stderr)
            return 1
        return 0
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
