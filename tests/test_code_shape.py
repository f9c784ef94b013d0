"""The package's shape, checked: no class is over ``MAX_CLASS_LINES`` lines (issue 31: a class
that long holds more than one concern), and persistent ranks reach their ranks through one
transport (``persistent.transport.RankTransport``), not by a subclass of the pool that overrides
its private steps.

``LONG_CLASSES`` lists the classes still over the limit, each with why; a test fails once one of
them is back under it (then it leaves the list), so the list can only shrink."""
from __future__ import annotations

import ast
import textwrap
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "notebook_launch"
MAX_CLASS_LINES = 250
LONG_CLASSES: dict[str, str] = {}


def long_classes(source: str, limit: int = MAX_CLASS_LINES) -> dict[str, int]:
    """Class name -> its lines (``def`` to its last line), for each class over ``limit``."""
    found = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > limit:
                found[node.name] = lines
    return found


def package_long_classes() -> dict[str, int]:
    return {f"{path.relative_to(PACKAGE).as_posix()}::{name}": lines
            for path in sorted(PACKAGE.rglob("*.py")) for name, lines in long_classes(path.read_text()).items()}


def test_no_class_is_over_250_lines():
    found = package_long_classes()
    new = {name: lines for name, lines in found.items() if name not in LONG_CLASSES}
    assert not new, f"classes over {MAX_CLASS_LINES} lines (split them by concern): {new}"
    shrunk = sorted(set(LONG_CLASSES) - set(found))
    assert not shrunk, f"no longer over {MAX_CLASS_LINES} lines, take them off LONG_CLASSES: {shrunk}"


def test_the_persistent_package_has_no_long_class_at_all():
    assert not {name for name in LONG_CLASSES if name.startswith("persistent/")}
    assert not {name for name in package_long_classes() if name.startswith("persistent/")}


def test_the_scan_finds_a_long_class():
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_CLASS_LINES))
    source = textwrap.dedent("class Short:\n    pass\n\n\nclass Long:\n") + body + "\n"
    assert long_classes(source) == {"Long": MAX_CLASS_LINES + 1}


def transport_paths() -> list[Path]:
    """Where the pool and the transports live: ``persistent/`` and each engine's ``persistent.py``."""
    return sorted((PACKAGE / "persistent").glob("*.py")) + sorted((PACKAGE / "engines").glob("*/persistent.py"))


def _classes(path: Path) -> list[ast.ClassDef]:
    return [node for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ClassDef)]


def _base_names(node: ast.ClassDef) -> set[str]:
    return {base.id if isinstance(base, ast.Name) else base.attr for base in node.bases
            if isinstance(base, (ast.Name, ast.Attribute))}


def test_no_pool_subclass_overrides_the_pools_private_steps():
    """How the ranks start, take a call, are interrupted, described and stopped is the transport's
    (``RankTransport``); a pool subclass (``RayRanks``) may add to the API, never replace a step."""
    subclasses = {f"{path.relative_to(PACKAGE).as_posix()}::{node.name}": [
        item.name for item in node.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
        and item.name.startswith("_") and not item.name.endswith("__")]
        for path in transport_paths() for node in _classes(path) if "Ranks" in _base_names(node)}
    assert "engines/ray/persistent.py::RayRanks" in subclasses   # the scan sees the ones there are
    assert not {name: methods for name, methods in subclasses.items() if methods}


def test_every_transport_implements_the_interface():
    """Ranks of this machine, and ranks of other machines (``engines.remote.persistent.RemoteTransport``:
    Ray's, SLURM's)."""
    bases = {node.name: _base_names(node) for path in transport_paths() for node in _classes(path)}
    assert {name for name, names in bases.items() if "RankTransport" in names} == {"LocalTransport", "RemoteTransport"}
    assert {name for name, names in bases.items() if "RemoteTransport" in names} == {"RayTransport", "SlurmTransport"}
    from notebook_launch.engines.local.persistent import LocalTransport
    from notebook_launch.engines.ray.persistent import RayTransport
    from notebook_launch.engines.slurm.persistent import SlurmTransport
    for transport in (LocalTransport, RayTransport, SlurmTransport):
        assert not transport.__abstractmethods__, transport   # every step of RankTransport is its own


def test_persistent_ranks_need_no_type_ignore():
    """The pool's transports are typed as what they are: no ``# type: ignore`` in persistent/
    (the interrupt slots are ``CallInterrupts``; spawned ranks' extra fds go to ``SpawnBackend.start``)."""
    ignored = [f"{path.name}:{number}" for path in transport_paths()
               for number, line in enumerate(path.read_text().splitlines(), 1) if "type: ignore" in line]
    assert not ignored


# Issue 46 item 4: no module over 450 lines, no function body over 60 (whole jobs moved apart, not
# functions cut in arbitrary places), no package over 16 modules and at most 12 modules at the top.
# What is still over is listed with why; a test fails once one of them is back under (it leaves the
# list), so each list can only shrink.
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 60
MAX_PACKAGE_MODULES = 16
MAX_TOP_MODULES = 12
LONG_MODULES: dict[str, str] = {
}
LONG_FUNCTIONS: dict[str, str] = {
}
BIG_PACKAGES: dict[str, str] = {
}


def body_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """A function's body, its docstring left out."""
    body = node.body
    first = body[1] if len(body) > 1 and isinstance(body[0], ast.Expr) and isinstance(
        getattr(body[0], "value", None), ast.Constant) else body[0]
    return (node.end_lineno or node.lineno) - first.lineno + 1


def shape_findings() -> tuple[set[str], set[str], set[str], int]:
    modules, functions, packages = set(), set(), set()
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        if len(path.read_text().splitlines()) > MAX_MODULE_LINES:
            modules.add(name)
        functions |= {f"{name}::{node.name}" for node in ast.walk(ast.parse(path.read_text()))
                      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                      and body_lines(node) > MAX_FUNCTION_LINES}
    for folder in sorted(p for p in PACKAGE.rglob("*") if (p / "__init__.py").exists()):
        if len([p for p in folder.glob("*.py") if p.name != "__init__.py"]) > MAX_PACKAGE_MODULES:
            packages.add(folder.relative_to(PACKAGE).as_posix())
    return modules, functions, packages, len(list(PACKAGE.glob("*.py")))


def test_no_module_function_or_package_outgrew_its_room():
    modules, functions, packages, top = shape_findings()
    for found, known, what in ((modules, LONG_MODULES, f"modules over {MAX_MODULE_LINES} lines"),
                               (functions, LONG_FUNCTIONS, f"function bodies over {MAX_FUNCTION_LINES} lines"),
                               (packages, BIG_PACKAGES, f"packages over {MAX_PACKAGE_MODULES} modules")):
        assert found <= set(known), f"{what} (move whole jobs apart): {sorted(found - set(known))}"
        assert set(known) <= found, f"no longer {what}, take them off the list: {sorted(set(known) - found)}"
    assert top <= MAX_TOP_MODULES, f"{top} modules at the top of the package: group them (docs/architecture.md)"


def test_the_shape_scan_finds_a_long_function():
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES + 1))
    node = ast.parse(f'def f():\n    """Why."""\n{body}\n').body[0]
    assert isinstance(node, ast.FunctionDef) and body_lines(node) == MAX_FUNCTION_LINES + 1
