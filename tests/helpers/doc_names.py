"""Which names in the docs and the package's docstrings and comments point where nothing of ours is now.

Why: issue 46 moved many modules (CHANGELOG.md lists the old paths), and a sentence that names the old path
reads as well as ever while it points at nothing. So a dotted token is checked when its first segment names one
of our packages (a current sub-package of notebook_launch, or what moved away: each old path's top-level name
and its segments that no module bears now), and it passes only when it resolves: absolutely
(``notebook_launch.x.y``), relative to a module whose dotted path ends with a prefix of the token followed by
attributes that resolve (``oom.MemoryWatch`` is supervise/oom.py's), or as another library's name
(``ray.get``). A token whose first segment is none of ours (``err.rank``, ``xmp.spawn``) is prose about a
variable or another library: not checked. A moved-away module's name alone (``ray_ranks``) and a path into the
package (``rank/preload``, ``start.py``) are checked too.

Everything is read statically (ast, file paths): nothing is imported, so the whole check takes about a second
where importing ray alone takes several, and it runs no import's side effects.
"""
from __future__ import annotations

import ast
import functools
import importlib.util
import io
import re
import tokenize
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Union

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "notebook_launch"
# docs: `a.b` (not inside ``...``), optionally called: `ranks.run(...)`; package: ``a.b``
DOC_TOKEN = re.compile(r"(?<!`)`([A-Za-z_]\w*(?:\.\w+)*)(?:\([^`]*\))?`(?!`)")
PLAIN_TOKEN = re.compile(r"(?<![\w.`/])([A-Za-z_]\w*(?:\.\w+)+)(?![\w`/])")
# a path in the package: `rank/reports/remote_where`, `engines/base.py`, `notebook_launch/rank/` (a bare
# `start.py` comes as a dotted token)
DOC_PATH = re.compile(r"(?<!`)`((?:[\w.-]+/)+[\w.-]*)`(?!`)")
PY_PATH = re.compile(r"``((?:[\w.-]+/)+[\w.-]*)``")
PY_TOKEN = re.compile(r"``([A-Za-z_]\w*(?:\.\w+)*)(?:\([^`]*\))?``")
# a last segment that makes the token a file's name (``state.json``), not a module's
FILE_ENDINGS = frozenset("py md toml json jsonl txt yml yaml sh log html svg png ipynb pkl csv out err pid conf"
                         .split())


@dataclass(frozen=True)
class Module:
    """A module found by its path; ``path`` None: no Python source to read (an extension), so any name passes."""
    name: str
    path: Path | None
    package_dirs: tuple[Path, ...]


@dataclass(frozen=True)
class Cls:
    node: ast.ClassDef
    module: Module


Binding = Union[Module, Cls, str, None]  # str "value": a name bound to something else; None: not there
VALUE = "value"


def _top_spec_dirs(top: str) -> tuple[Path | None, tuple[Path, ...]] | None:
    """Where top-level ``top`` lives, found without importing it; another library's only (never this repo's)."""
    if top == PACKAGE:
        return ROOT / PACKAGE / "__init__.py", (ROOT / PACKAGE,)
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    dirs = tuple(Path(p) for p in (spec.submodule_search_locations or ()))
    origin = Path(spec.origin) if spec.origin and spec.has_location else None
    if any(ROOT in p.parents and "site-packages" not in p.parts for p in (*dirs, *([origin] if origin else []))):
        return None  # a folder of this repository on sys.path (tests/, scripts/): not a library
    source = origin if origin is not None and origin.suffix == ".py" else None
    return source, dirs


@functools.cache
def locate(name: str) -> Module | None:
    """The module ``name`` by its files: ours under ROOT, another library's where its top-level spec points."""
    parts = name.split(".")
    found = _top_spec_dirs(parts[0])
    if found is None:
        return None
    path, dirs = found
    for part in parts[1:]:
        if not dirs:
            return None
        path, dirs = _child(dirs, part)
        if path is None and not dirs:
            return None
    return Module(name, path, dirs)


def _child(dirs: tuple[Path, ...], part: str) -> tuple[Path | None, tuple[Path, ...]]:
    for folder in dirs:
        if (folder / part / "__init__.py").is_file():
            return folder / part / "__init__.py", (folder / part,)
        if (folder / f"{part}.py").is_file():
            return folder / f"{part}.py", ()
        if (folder / part).is_dir() and not part.startswith("_"):
            return None, (folder / part,)  # a namespace package: names only its sub-modules
        if any(folder.glob(f"{part}.*.so")) or any(folder.glob(f"{part}.*.pyd")):
            return None, ()
    return None, ()


def _top_statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """A module's statements, into if/try/with blocks (``try: import x`` binds x), never into defs."""
    for node in body:
        yield node
        if isinstance(node, (ast.If, ast.Try, ast.With)):
            blocks = [node.body, getattr(node, "orelse", []), getattr(node, "finalbody", [])]
            blocks += [handler.body for handler in getattr(node, "handlers", [])]
            for block in blocks:
                yield from _top_statements(block)


def _assigned_names(node: ast.stmt) -> Iterator[str]:
    targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
    for target in targets:
        for sub in ast.walk(target) if target is not None else ():
            if isinstance(sub, ast.Name):
                yield sub.id


@dataclass(frozen=True)
class Parsed:
    tree: ast.Module
    docstrings: tuple[str, ...]
    defined: frozenset[str]  # every name the file defines, binds or sets as an attribute


def parsed(path: Path) -> Parsed:
    return facts(path.read_text(encoding="utf-8"))


@functools.cache
def facts(text: str) -> Parsed:
    """One walk of a file's tree, shared by every question asked of it (the check must stay fast)."""
    tree = ast.parse(text)
    docstrings: list[str] = []
    defined: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            docstrings.append(ast.get_docstring(node, clean=False) or "")
            if not isinstance(node, ast.Module):
                defined.add(node.name)
        elif isinstance(node, ast.Name):
            defined.add(node.id)
        elif isinstance(node, ast.arg):
            defined.add(node.arg)
        elif isinstance(node, ast.Attribute):
            defined.add(node.attr)
    return Parsed(tree, tuple(docstrings), frozenset(defined))


@functools.cache
def module_names(module: Module) -> tuple[dict[str, object], tuple[str, ...]] | None:
    """A module's top-level names and its ``import *`` sources; None where any name may exist
    (no source to read, or a module ``__getattr__``)."""
    if module.path is None:
        return None if not module.package_dirs else ({}, ())
    tree = parsed(module.path).tree
    names: dict[str, object] = {}
    stars: list[str] = []
    package = module.name if module.path.name == "__init__.py" else module.name.rpartition(".")[0]
    for node in _top_statements(tree.body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names[node.name] = VALUE
        elif isinstance(node, ast.ClassDef):
            names[node.name] = Cls(node, module)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            names.update(dict.fromkeys(_assigned_names(node), VALUE))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                names[alias.asname or alias.name.split(".")[0]] = ("import", alias.name if alias.asname else
                                                                   alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(package, node.module, node.level)
            for alias in node.names:
                if alias.name == "*":
                    stars.append(source)
                else:
                    names[alias.asname or alias.name] = ("from", source, alias.name)
    if "__getattr__" in names:
        return None
    return names, tuple(stars)


def _absolute(package: str, module: str | None, level: int) -> str:
    if level == 0:
        return module or ""
    base = package.split(".")[: len(package.split(".")) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def _bound(binding: object, depth: int) -> Binding:
    """What a module-level name is bound to. An import of what cannot be read here (a library not installed)
    is a value: the code that imports it is the check of that."""
    if isinstance(binding, (Module, Cls, str)):
        return binding
    if not isinstance(binding, tuple):
        return None
    kind, source, *attr = binding
    if kind == "import":
        return locate(source) or VALUE
    sub = locate(f"{source}.{attr[0]}")
    if sub is not None:
        return sub
    origin = locate(source)
    return (member(origin, attr[0], depth + 1) if origin is not None else None) or VALUE


def member(owner: Binding, name: str, depth: int = 0) -> Binding:
    """``owner.name``: a sub-module, a module's name (through ``import *`` too), a class's attribute; any
    attribute of a value passes (it is its type's, which prose does not name)."""
    if depth > 30 or owner == VALUE:
        return VALUE
    if isinstance(owner, Cls):
        return class_member(owner, name, depth, strict=False)
    if not isinstance(owner, Module):
        return None
    sub = locate(f"{owner.name}.{name}")
    if sub is not None:
        return sub
    read = module_names(owner)
    if read is None:
        return VALUE
    names, stars = read
    if name in names:
        return _bound(names[name], depth)
    for star in stars:
        source = locate(star)
        found = member(source, name, depth + 1) if source is not None else VALUE
        if found is not None:
            return found
    return None


@functools.cache
def _self_attributes(node: ast.ClassDef) -> frozenset[str]:
    return frozenset(_self_assigned(node))


def _self_assigned(node: ast.ClassDef) -> Iterator[str]:
    for sub in ast.walk(node):
        targets = sub.targets if isinstance(sub, ast.Assign) else [getattr(sub, "target", None)]
        for target in targets if isinstance(sub, (ast.Assign, ast.AnnAssign)) else ():
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
                yield target.attr


def class_member(cls: Cls, name: str, depth: int, strict: bool) -> Binding:
    """A class's attribute: its body, ``self.x =`` in its methods, its bases'. ``strict``: a base that cannot
    be read (another library's: ``enum.Enum``) answers nothing, instead of anything."""
    for node in cls.node.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return VALUE
        if isinstance(node, ast.ClassDef) and node.name == name:
            return Cls(node, cls.module)
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and name in _assigned_names(node):
            return VALUE
    if name in _self_attributes(cls.node):
        return VALUE
    for base in cls.node.bases:
        found = _base(base, cls.module, depth)
        if isinstance(found, Cls):
            inherited = class_member(found, name, depth + 1, strict)
            if inherited is not None:
                return inherited
        elif found == VALUE and not strict:
            return VALUE
    return None


def _base(expr: ast.expr, module: Module, depth: int) -> Binding:
    if isinstance(expr, ast.Subscript):
        expr = expr.value  # Generic[T]
    dotted: list[str] = []
    while isinstance(expr, ast.Attribute):
        dotted.insert(0, expr.attr)
        expr = expr.value
    if not isinstance(expr, ast.Name):
        return VALUE
    read = module_names(module)
    if read is None or expr.id not in read[0]:
        return None if expr.id == "object" else VALUE  # a builtin base: Exception and the like
    owner = _bound(read[0][expr.id], depth + 1)
    for part in dotted:
        owner = member(owner, part, depth + 1)
    return owner


@functools.cache
def our_modules() -> tuple[str, ...]:
    paths = sorted((ROOT / PACKAGE).rglob("*.py"))
    return tuple(".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__") for p in paths)


@functools.cache
def moved_away_names() -> frozenset[str]:
    """Names a token may start with when it names an old path (CHANGELOG.md's tables): each old path's
    top-level package or module (``backends``, ``state``), and each of its segments that no module bears now
    (``ray_ranks``, ``ray_serve``). A segment that some module still bears (``ranks``: notebook_launch/ranks.py)
    is left out: a token that starts with it is as likely a variable's (``ranks.run``)."""
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    current = {name.rpartition(".")[2] for name in our_modules()}
    names: set[str] = set()
    for old in re.findall(r"^\| `(notebook_launch\.[^`]+)`", text, re.M):
        group = re.search(r"\{([^}]*)\}", old)
        paths = [old[: group.start()] + alt + old[group.end():] for alt in group[1].split(",")] if group else [old]
        for path in paths:
            parts = [part for part in path.split(".")[1:] if part.isidentifier()]
            names.update(parts[:1] + [part for part in parts[1:] if part not in current])
    return frozenset(names)


@functools.cache
def checked_first_segments() -> frozenset[str]:
    packages = {p.parent.name for p in (ROOT / PACKAGE).rglob("__init__.py")}
    return frozenset(packages | moved_away_names() | {PACKAGE})


def _walk(owner: Binding, rest: list[str], instance_ok: bool) -> bool:
    for index, part in enumerate(rest):
        found = member(owner, part)
        if found is None and index == 0 and instance_ok and isinstance(owner, Module):
            found = _instance_attribute(owner, part)  # ``state.stop_requested``: a state.py object's
        if found is None:
            return False
        if found == VALUE:
            return True
        owner = found
    return True


def _instance_attribute(module: Module, name: str) -> Binding:
    """Prose names an object by its module (``state.stop_requested`` for record/state.py's RunState): an
    attribute that one of the module's own classes defines, read strictly (an unread base answers nothing)."""
    read = module_names(module)
    for binding in read[0].values() if read else ():
        if isinstance(binding, Cls) and binding.module == module:
            if class_member(binding, name, 0, strict=True) is not None:
                return VALUE
    return None


def resolves(token: str) -> bool:
    """Whether a dotted name names something that is there: absolute, relative to one of our modules, or
    another library's."""
    parts = token.split(".")
    if parts[0] == PACKAGE:
        top = locate(PACKAGE)
        return _walk(top, parts[1:], instance_ok=False)
    for cut in range(len(parts), 0, -1):
        suffix = "." + ".".join(parts[:cut])
        for name in our_modules():
            if name.endswith(suffix) and _walk(locate(name), parts[cut:], instance_ok=True):
                return True
    library = locate(parts[0])
    if library is None:
        return parts[0] in declared_libraries()  # one not installed here (``ray`` is an extra): cannot tell
    return _walk(library, parts[1:], instance_ok=False)


@functools.cache
def declared_libraries() -> frozenset[str]:
    """The import names of what pyproject.toml depends on, extras too (``ray``, ``torch_xla``)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    wanted = [*project.get("dependencies", ()), *(d for ds in project.get("optional-dependencies", {}).values()
                                                  for d in ds)]
    return frozenset(re.split(r"[^\w.-]", d, maxsplit=1)[0].lower().replace("-", "_") for d in wanted)


@functools.cache
def gone_module_names() -> frozenset[str]:
    """Names of modules that moved away which nothing of ours bears now, as a module or as any name its code
    defines (``start`` is a method's too): said alone (``ray_ranks``), they can only mean the old module."""
    defined = {name for path in (ROOT / PACKAGE).rglob("*.py") for name in parsed(path).defined}
    current = {name.rpartition(".")[2] for name in our_modules()}
    return frozenset(moved_away_names() - current - defined)


@functools.cache
def our_paths() -> frozenset[str]:
    """The package's files and folders as paths from the repository (a module's also without ``.py``)."""
    paths = {PACKAGE}
    for path in (ROOT / PACKAGE).rglob("*"):
        if "__pycache__" not in path.parts:
            relative = path.relative_to(ROOT).as_posix()
            paths.update({relative, relative.removesuffix(".py")})
    return frozenset(paths)


def is_stale_path(token: str) -> bool:
    """A path whose first part is one of our packages (current or moved away: `start.py`) must be the end of
    a path in the package: `rank/preload` is notebook_launch/rank/preload.py."""
    path = token.rstrip("/")
    if path.split("/")[0].removesuffix(".py") not in checked_first_segments():
        return False
    return not any(known == path or known.endswith("/" + path) for known in our_paths())


def is_stale(token: str) -> bool:
    if "/" in token or token.endswith(".py"):
        return is_stale_path(token)
    if "." not in token:
        return token in gone_module_names()
    if token.split(".")[0] not in checked_first_segments():
        return False
    if token.rsplit(".", 1)[1] in FILE_ENDINGS:
        return False
    return not resolves(token)


# these two name stale tokens on purpose: the rule's own examples
RULE_FILES = ("tests/helpers/doc_names.py", "tests/test_doc_names.py")


def checked_files() -> list[Path]:
    """The docs, and the Python of the package, its tests, benchmarks and scripts (a test's docstring that
    names a moved module misleads as much as the package's own)."""
    docs = sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md", ROOT / "CONTRIBUTING.md"]
    code = [path for folder in (PACKAGE, "tests", "benchmarks", "scripts")
            for path in sorted((ROOT / folder).rglob("*.py")) if path.relative_to(ROOT).as_posix() not in RULE_FILES]
    return docs + code


@functools.cache
def comments(text: str) -> tuple[str, ...]:
    """The file's comments, as Python reads them (a '#' inside a string is not one)."""
    return tuple(token.string for token in tokenize.generate_tokens(io.StringIO(text).readline)
                 if token.type == tokenize.COMMENT)


def tokens_in(text: str, python: bool) -> set[str]:
    """Docs: `single` backticks. Python: ``double`` backticks anywhere, and any dotted word in comments and
    docstrings (prose there names modules without backticks too: ``# (backends.spawn)``). Dotted names and
    paths both."""
    if not python:
        return set(DOC_TOKEN.findall(text)) | set(DOC_PATH.findall(text))
    prose = [*comments(text), *facts(text).docstrings]
    found = set(PY_TOKEN.findall(text)) | set(PY_PATH.findall(text))
    return found | {token for part in prose for token in PLAIN_TOKEN.findall(part)}


def stale_names(files: Iterable[Path] | None = None) -> dict[str, list[str]]:
    """Each file (relative to the repository) with the stale tokens it names."""
    found: dict[str, list[str]] = {}
    for path in files if files is not None else checked_files():
        tokens = tokens_in(path.read_text(encoding="utf-8"), python=path.suffix == ".py")
        stale = sorted(t for t in tokens if is_stale(t))
        if stale:
            found[str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)] = stale
    return found
