"""The package's import graph has no cycle, between modules and between packages: imports go
one way, api -> options/prepare -> run -> launchers (``backends``, ``elastic``) -> rank ->
protocol and ``channels``. Imports inside functions count too (they are edges all the same),
only ``TYPE_CHECKING`` blocks do not.

At package level each subpackage (``rank``, ``supervise``, ...) and each top-level module is
one node. ``KNOWN_BACK_EDGES`` lists the package edges that still point the wrong way while
they are being moved; a test fails when one of them is gone (then it leaves the list), so
the list can only shrink, and the check that ignores them fails on any new one."""
from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import AbstractSet

PACKAGE = Path(__file__).resolve().parents[1] / "notebook_launch"
sys.path.insert(0, str(PACKAGE.parent / "scripts"))
from package_graph import imports_of, module_name, unit_of  # noqa: E402  # one reading of the imports: the docs' graph's


def import_graph(type_checking: bool = False) -> dict[str, set[str]]:
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    graph = {module_name(p): imports_of(p, modules, type_checking) for p in paths}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = walk(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = walk(node)
            if cycle:
                return cycle
    return None


def test_the_graph_is_read():
    graph = import_graph()
    assert "notebook_launch.launcher" in graph["notebook_launch"]
    assert "notebook_launch.supervise.supervisor" in graph["notebook_launch.scaffold.run"]


def test_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_elastic_does_not_import_the_launcher():
    graph = import_graph()
    for name, targets in graph.items():
        if name.startswith("notebook_launch.engines.elastic"):
            assert "notebook_launch.launcher" not in targets, name


def test_the_api_module_is_imported_for_its_api_only():
    """launcher.py is the API: modules of ours that call it (the package, %%launch, the CLI) take
    ``notebook_launcher`` and nothing else from it; what every entry point does before starting
    ranks is ``prepare``'s, so persistent ranks import that, never the launch's API module."""
    graph = import_graph()
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        if "notebook_launch.launcher" not in graph[name]:
            continue
        taken = {alias.name for node in ast.walk(ast.parse(path.read_text()))
                 if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("launcher")
                 for alias in node.names}
        assert taken == {"notebook_launcher"}, (name, taken)
    for name, targets in graph.items():
        if name.startswith("notebook_launch.persistent"):
            assert "notebook_launch.launcher" not in targets, name
    # the local transport plans as a launch does, with the planning its engine's chooser hands it
    assert "notebook_launch.planning.prepare" in graph["notebook_launch.engines"]
    assert "notebook_launch.planning.prepare" not in graph["notebook_launch.engines.local.persistent"]


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


# Package edges that still point the wrong way, each with the module edges behind it and why
# it is there. Empty is the goal (issue 21 item 2); test_every_known_back_edge_is_still_there
# makes an entry that was fixed leave the list.
KNOWN_BACK_EDGES: dict[tuple[str, str], str] = {}


def package_edges(graph: dict[str, set[str]]) -> dict[tuple[str, str], list[str]]:
    """Each package edge with the module edges that make it."""
    edges: dict[tuple[str, str], list[str]] = {}
    for module, targets in graph.items():
        for target in sorted(targets):
            a, b = unit_of(module), unit_of(target)
            if a != b:
                edges.setdefault((a, b), []).append(f"{module} -> {target}")
    return edges


def package_graph(edges: dict[tuple[str, str], list[str]],
                  ignore: AbstractSet[tuple[str, str]] = frozenset()) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(b, set())
        if (a, b) not in ignore:
            graph.setdefault(a, set()).add(b)
        else:
            graph.setdefault(a, set())
    return graph


def test_packages_import_one_way():
    edges = package_edges(import_graph())
    cycle = find_cycle(package_graph(edges, ignore=set(KNOWN_BACK_EDGES)))
    if cycle:
        detail = "\n".join(f"  {a} -> {b}: {', '.join(edges[(a, b)][:4])}" for a, b in zip(cycle, cycle[1:]))
        raise AssertionError("package import cycle: " + " -> ".join(cycle) + "\n" + detail)


def test_every_known_back_edge_is_still_there():
    edges = package_edges(import_graph())
    gone = [edge for edge in KNOWN_BACK_EDGES if edge not in edges]
    assert not gone, f"fixed, so remove them from KNOWN_BACK_EDGES: {gone}"


def test_the_package_check_finds_a_back_edge():
    graph = {"notebook_launch.rank.a": {"notebook_launch.engines.local.b"},
             "notebook_launch.engines.local.b": {"notebook_launch.rank.c"}, "notebook_launch.rank.c": set()}
    assert find_cycle(package_graph(package_edges(graph))) == ["engines.local", "rank", "engines.local"]


def test_channels_and_protocol_depend_on_nothing_of_ours():
    """The types every side shares import only each other: the bottom of the graph. Below them
    there is only fork_locks (locks renewed in forked children, the protocol's send lock among
    them) and memory_errors (which exceptions are allocation failures, decided as an ERROR is
    made), which import nothing of ours."""
    graph = import_graph()
    assert graph["notebook_launch.wire.fork_locks"] == set()
    assert graph["notebook_launch.wire.memory_errors"] == set()
    for name, targets in graph.items():
        if name.startswith("notebook_launch.channels"):
            assert all(t.startswith("notebook_launch.channels") for t in targets), (name, targets)
    assert graph["notebook_launch.wire.protocol"] <= {"notebook_launch.wire.fork_locks",
                                                      "notebook_launch.wire.memory_errors"}


# What runs inside a rank but lives in its engine's folder (issue 46: an engine's rank side sits
# beside its notebook side): each is held to the rank's rule, module by module.
RANK_SIDE_OF_ENGINES = ("notebook_launch.engines.ray.actor", "notebook_launch.engines.remote.serve",
                        "notebook_launch.engines.xla.replicas",
                        "notebook_launch.engines.slurm.task", "notebook_launch.engines.slurm.node_agent",
                        "notebook_launch.engines.local.start_server")
NOTEBOOK_SIDE = {"supervise", "diagnose", "run", "launcher", "display", "persistent", "session", "state",
                 "ranks", "ranks_magic", "engines", "engines.base"}


def is_rank_side(unit: str) -> bool:
    """``rank`` (the rank's core) and its sub-packages (``rank.integrations``, ...)."""
    return unit == "rank" or unit.startswith("rank.")


def test_the_rank_side_imports_no_launcher_supervisor_or_api():
    """What runs inside a rank never imports the notebook side's launchers, supervisor, run
    scaffold or API: ``rank/`` imports no engine at all, and an engine's rank side (its modules
    in ``RANK_SIDE_OF_ENGINES``) only the rank side, what its engine's ranks share (``remote``) and
    its own folder."""
    edges = package_edges(import_graph())
    wrong = {edge: modules for edge, modules in edges.items()
             if is_rank_side(edge[0]) and (edge[1] in NOTEBOOK_SIDE or edge[1].startswith("engines"))
             and edge not in KNOWN_BACK_EDGES}
    assert not wrong, wrong
    graph = import_graph()
    for module in RANK_SIDE_OF_ENGINES:
        own = unit_of(module)
        bad = {t for t in graph[module] if unit_of(t) in NOTEBOOK_SIDE
               or (unit_of(t).startswith("engines.") and unit_of(t) not in (own, "engines.remote"))}
        assert not bad, (module, bad)


def test_hang_diagnosis_sits_below_every_path_that_asks_it():
    """``diagnose`` (issue 31) is asked by launches (the supervisor), persistent calls, XLA's
    launcher, Ray's ranks and elastic nodes; it imports none of them, nor the run state or a
    display: what it finds goes back to its caller, which draws and logs it."""
    callers = {"supervise", "persistent", "backends", "elastic", "display", "state", "session", "run",
               "ray", "launcher", "magic", "cli"}
    edges = package_edges(import_graph())
    wrong = {edge: modules for edge, modules in edges.items() if edge[0] == "diagnose" and edge[1] in callers}
    assert not wrong, wrong
    graph = import_graph()
    assert "notebook_launch.diagnose.ranks" in graph["notebook_launch.supervise.hang_watch"]   # the supervisor's
    assert "notebook_launch.diagnose.ranks" in graph["notebook_launch.persistent.whereabouts"]   # Ranks.stacks()'s


WHAT_LAUNCHERS_MUST_NOT_IMPORT = ("notebook_launch.supervise", "notebook_launch.display",
                                  "notebook_launch.record.state")


def defines_a_launcher(path: Path) -> bool:
    return any(isinstance(node, ast.ClassDef) and any(
        (isinstance(base, ast.Name) and base.id.endswith("Launcher"))   # or a shared part of one
        or (isinstance(base, ast.Attribute) and base.attr.endswith("Launcher")) for base in node.bases)
        for node in ast.walk(ast.parse(path.read_text())))


def launch_paths(graph: dict[str, set[str]]) -> set[str]:
    """The modules that start ranks: the launcher interface (``engines.base``), every module that
    defines a ``Launcher`` (each engine's, in its own folder: ``engines.local.fork``,
    ``engines.ray.launch``), and the modules of its own folder it imports, directly or through
    each other (``engines.ray.gang``, ``engines.ray.connect``)."""
    found = {"notebook_launch.engines.base"}   # the interface every launcher implements
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        if name in found or not defines_a_launcher(path):
            continue
        engine = name.rpartition(".")[0] + "."
        todo = [name]
        while todo:
            module = todo.pop()
            if module not in found:
                found.add(module)
                todo.extend(t for t in graph[module] if t.startswith(engine))
    return found


def forbidden_launcher_imports(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Launch path -> what it imports of the supervisor, the displays and the run state."""
    wrong = {}
    for module in sorted(launch_paths(graph)):
        bad = {t for t in graph[module] if t.startswith(WHAT_LAUNCHERS_MUST_NOT_IMPORT)}
        if bad:
            wrong[module] = bad
    return wrong


def test_launchers_only_start_processes():
    """A launcher starts processes and nothing else (issue 31 item 6): it draws nothing, reads no
    run state and watches no rank. What a start that waits shows (Ray placing the ranks) goes
    through ``engines.base.StartWatch``, which the supervisor's side implements; a start that
    fails raises ``StartFailed``, which the caller makes the run's LaunchError. So no launch path
    imports ``supervise``, ``display`` or ``state``, not even for its annotations."""
    graph = import_graph(type_checking=True)
    paths = launch_paths(graph)
    assert {"notebook_launch.engines.local.fork", "notebook_launch.engines.base", "notebook_launch.engines.ray.launch",
            "notebook_launch.engines.ray.gang", "notebook_launch.engines.ray.connect"} <= paths, paths
    assert "notebook_launch.engines.ray.run" not in paths   # the Ray run is the scaffold's, not a launcher's
    wrong = forbidden_launcher_imports(graph)
    assert not wrong, f"launch paths that import the supervisor, a display or the run state: {wrong}"



def private_names_imported_across_packages() -> dict[str, list[str]]:
    """Module -> the private names (``_x``) it imports from a module of another package: a name
    two packages share needs a public home (``magics.options`` for the two magics, issue 31)."""
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                base = package.split(".")
                target = ".".join(base[:len(base) - (node.level - 1)] + ([node.module] if node.module else []))
            elif (node.module or "").startswith("notebook_launch"):
                target = node.module or ""
            else:
                continue
            if target.rpartition(".")[0] == package or target == package:
                continue
            private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
            if private:
                found.setdefault(name, []).extend(f"{target}.{n}" for n in private)
    return found


def test_no_module_imports_another_packages_private_names():
    assert private_names_imported_across_packages() == {}


BOTH_SIDES_FORMATS = ("notebook_launch.channels.where_request", "notebook_launch.channels.commands",
                      "notebook_launch.channels.interrupt_slot", "notebook_launch.channels.remote_commands",
                      "notebook_launch.channels.remote_where")


def test_the_formats_both_sides_read_are_in_channels():
    """A format the notebook and its ranks both read (issue 31: asking a rank where it is, persistent
    ranks' command frames and interrupt slot, the messages a persistent rank on another machine
    reads) lives in ``channels``, so that neither side imports the other's module for it: each is
    read by the rank side and by a notebook-side package. What needs ``shared_tensors`` (a command's
    pickle with its tensors) is each side's own half."""
    graph = import_graph()
    for fmt in BOTH_SIDES_FORMATS:
        users = {"rank" if module in RANK_SIDE_OF_ENGINES or is_rank_side(unit_of(module)) else unit_of(module)
                 for module, targets in graph.items() if fmt in targets}
        assert "rank" in users and users - {"rank", "channels"}, (fmt, users)
    assert "notebook_launch.wire.shared_tensors" in graph["notebook_launch.persistent.command_frames"]
    assert "notebook_launch.wire.shared_tensors" in graph["notebook_launch.rank.serve"]


# Modules outside ``engines/`` that reach into an engine's folder, each with why it cannot go
# through ``engines`` (the chooser imports the options and the planning, so a module below it
# asking through it would make a cycle). Empty is the goal; the list can only shrink.
REACHING_INTO_AN_ENGINE: dict[tuple[str, str], str] = {
    ("notebook_launch", "notebook_launch.engines.local.start_process"):
        "notebook_launch.prestart() and %load_ext start the warm start process",
    ("notebook_launch.hooks", "notebook_launch.engines.local.warm_imports"):
        "%load_ext's between-cells imports are the fork launcher's warm imports",
    ("notebook_launch.slurm.node_agent", "notebook_launch.engines.slurm.node_agent"):
        "the documented `python -m notebook_launch.slurm.node_agent` path, kept as an alias",
}
# An engine's folder that imports another's (beyond ``remote``, what connect-back engines share),
# each with why.
ENGINE_ON_ENGINE: dict[tuple[str, str], str] = {
    ("engines.elastic", "engines.local"): "elastic's agent starts each attempt with this machine's launchers",
    ("engines.xla", "engines.local"): "xmp.spawn runs in a child the fork launcher forks",
    ("engines.slurm", "engines.local"): "the node agent imports ahead what the fork launcher would (warm_imports)",
}


def test_nothing_outside_engines_reaches_an_engine_but_through_its_interface():
    """Issue 46: the entry points, the run scaffold, the supervisor and the pool reach an engine
    through ``engines`` (``Engine``, ``engine_for``) and ``engines.base`` (``Launcher``) only."""
    graph = import_graph()
    found = {(module, target) for module, targets in graph.items() for target in targets
             if unit_of(target).startswith("engines.") and unit_of(target) != "engines.base"
             and not unit_of(module).startswith("engines")}
    assert found <= set(REACHING_INTO_AN_ENGINE), sorted(found - set(REACHING_INTO_AN_ENGINE))
    assert set(REACHING_INTO_AN_ENGINE) <= found, "gone, so take them off: " + str(
        sorted(set(REACHING_INTO_AN_ENGINE) - found))


def test_no_engine_imports_another_but_what_they_share():
    edges = package_edges(import_graph())
    found = {(a, b) for a, b in edges if a.startswith("engines.") and b.startswith("engines.")
             and b not in ("engines.base", "engines.remote")}
    assert found <= set(ENGINE_ON_ENGINE), {e: edges[e] for e in found - set(ENGINE_ON_ENGINE)}
    assert set(ENGINE_ON_ENGINE) <= found, sorted(set(ENGINE_ON_ENGINE) - found)
    assert ("engines.remote", "engines.ray") not in edges and ("engines.remote", "engines.slurm") not in edges


RANK_SUBPACKAGES = {"rank.integrations", "rank.reports", "rank.group", "rank.batch"}


def test_the_ranks_core_reaches_its_subpackages_only_by_name():
    """Issue 46: the rank's core (``rank``: bootstrap, the runner, the entry points) imports none of
    its sub-packages: what it installs or calls of them (the bridges, the relays, the reports, the
    process group's care) it names in ``rank.installs``, resolved with importlib. They import the
    core's tools (``after_import``, ``inherited_streams``), so an import the other way would close a
    cycle, which test_packages_import_one_way would also say."""
    edges = package_edges(import_graph())
    units = {unit for edge in edges for unit in edge}
    assert RANK_SUBPACKAGES <= units, units
    wrong = {edge: modules for edge, modules in edges.items() if edge[0] == "rank" and edge[1] in RANK_SUBPACKAGES}
    assert not wrong, wrong


def test_every_name_the_ranks_core_runs_resolves():
    """A name in ``rank.installs`` that no longer resolves (a module moved or renamed) would surface
    only in a rank: here it fails at once, each hook an ``install``, each warm module importable."""
    import importlib

    from notebook_launch.rank import installs
    for hook in installs.RANK_HOOKS:
        assert callable(importlib.import_module(hook.module).install), hook
    for module, function in ((installs.PROCESS_GROUPS, "keep_groups_used_by_ddp"),
                             (installs.PROCESS_GROUPS, "release_destroyed_groups"),
                             (installs.PEERS_JOINED, "before_exit"), (installs.PROGRESS, "flush")):
        assert callable(installs.named(module, function)), (module, function)
    for module in installs.WARM:
        importlib.import_module(module)
    assert all(unit_of(hook.module) in RANK_SUBPACKAGES | {"rank"} for hook in installs.RANK_HOOKS)
