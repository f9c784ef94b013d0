"""Who made the Accelerate state a notebook holds, where, and whether we can undo it for the user.

Accelerate keeps one process-wide state (``PartialState`` and ``AcceleratorState`` are Borgs:
every instance shares one dict). Forked ranks inherit it and each would train alone as rank 0,
so the launch guard refuses (preflight.check_no_accelerate_state). A common notebook pattern
makes one without meaning to: ``args = TrainingArguments(...)`` in a cell computes its device
at once (transformers' ``_setup_devices``), which creates a ``PartialState`` and caches it, and
the device, on ``args`` (``args.distributed_state``, ``args.__dict__["_setup_devices"]``).

The guard names the maker and its line (``TrainingArguments`` at ``Cell In[3], line 2``): the
cells' code (IPython's ``In``) is read for calls of Accelerate's and Transformers' constructors
outside function bodies, and the notebook's top-level names for the objects that hold the state.

When every holder is a ``TrainingArguments`` bound to a name in the notebook, nothing else made
the state (no Accelerator, AcceleratorState or bare PartialState), and no GPU or XLA device was
touched and no process group exists, the state can be undone safely: reset Accelerate's shared
state and drop the device each ``TrainingArguments`` cached, so every rank computes its own on
first use, as it would had the arguments been built inside the function
(``reset_for_training_arguments``).
"""
from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass
from typing import Any, Mapping, Sequence
from ..errors.best_effort import best_effort

# Calls that create (or start from) Accelerate's shared state when run in the notebook.
MAKER = re.compile(r"^(Accelerator|AcceleratorState|PartialState|\w*TrainingArguments|\w*Trainer|"
                   r"(SFT|DPO|GRPO|PPO|ORPO|KTO|CPO|Reward)Config)$")
ARGUMENTS = re.compile(r"^\w*TrainingArguments$|^(SFT|DPO|GRPO|PPO|ORPO|KTO|CPO|Reward)Config$")


@dataclass(frozen=True)
class Maker:
    """One call that may have made the state: ``TrainingArguments`` at ``Cell In[3], line 2``."""
    name: str               # the constructor's name as written
    where: str              # "Cell In[3], line 2"
    line: str               # the source line

    def describe(self) -> str:
        return f"{self.name} at {self.where}: {self.line.strip()}"


def makers_in_cells(cells: Sequence[str]) -> list[Maker]:
    """Calls of the constructors in ``MAKER`` run at a cell's top level (not inside a function or
    class body, whose code runs only when called), in execution order, since the last top-level
    ``..._reset_state(...)`` call (which undid what came before). ``cells[n]`` is cell n's code as
    IPython ran it (its ``In`` list)."""
    found: list[Maker] = []
    for count, source in enumerate(cells):
        if not source or not isinstance(source, str):
            continue
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        lines = source.splitlines()
        for node in _top_level_nodes(tree):
            if isinstance(node, ast.Call):
                name = _called_name(node.func)
                if name == "_reset_state":
                    found = []
                elif name and MAKER.match(name):
                    text = lines[node.lineno - 1] if node.lineno <= len(lines) else ""
                    found.append(Maker(name, f"Cell In[{count}], line {node.lineno}", text))
    return found


def _top_level_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node outside function, lambda and class bodies."""
    out: list[ast.AST] = []
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        out.append(node)
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                continue
            stack.append(child)
    out.sort(key=lambda n: (getattr(n, "lineno", 0), getattr(n, "col_offset", 0)))
    return out


def _called_name(func: ast.AST) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def holders_in_namespace(namespace: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """Top-level names bound to an object that holds Accelerate's state: an Accelerator, a
    PartialState/AcceleratorState, or TrainingArguments-like arguments whose device was computed."""
    held = []
    for name, value in list(namespace.items()):
        if name.startswith("_"):
            continue
        cls = type(value)
        mro = {c.__name__ for c in getattr(cls, "__mro__", ())}
        module = getattr(cls, "__module__", "") or ""
        if not (module.startswith("accelerate") or module.startswith("transformers") or module.startswith("trl")
                or mro & {"TrainingArguments", "Accelerator", "PartialState", "AcceleratorState"}):
            continue
        if mro & {"Accelerator", "PartialState", "AcceleratorState", "Trainer"}:
            held.append((name, value))
        elif "TrainingArguments" in mro and getattr(value, "__dict__", {}).get("distributed_state") is not None:
            held.append((name, value))
    return held


def notebook_namespace_and_cells() -> tuple[Mapping[str, Any], list[str]]:
    """The notebook's top-level names and its cells' code (empty outside IPython)."""
    ipython = sys.modules.get("IPython")
    shell = None
    if ipython is not None:
        with best_effort("IPython.get_ipython() failed"):
            shell = ipython.get_ipython()
    if shell is None:
        main = sys.modules.get("__main__")
        return (vars(main) if main is not None else {}), []
    namespace = shell.user_ns
    cells = namespace.get("In") or getattr(getattr(shell, "history_manager", None), "input_hist_parsed", [])
    return namespace, list(cells)


@dataclass(frozen=True)
class StateOrigin:
    makers: tuple[Maker, ...]                 # constructor calls found in the cells, first first
    holders: tuple[tuple[str, str], ...]      # (name, class name) of top-level holders
    resettable: tuple[Any, ...]               # TrainingArguments to refresh, when a reset is safe

    def describe(self) -> str:
        parts = []
        if self.makers:
            parts.append("made by " + "; ".join(m.describe() for m in self.makers[:3]))
        if self.holders:
            parts.append("held by " + ", ".join(f"`{n}` ({c})" for n, c in self.holders[:5]))
        return " (" + "; ".join(parts) + ")" if parts else ""


def find_origin(accelerator_state: bool, namespace: Mapping[str, Any] | None = None,
                cells: Sequence[str] | None = None) -> StateOrigin:
    """What made the state and who holds it. ``resettable`` is non-empty only when every holder
    and every maker is a TrainingArguments-like object bound to a name, and no AcceleratorState
    exists (``accelerator_state``): then ``reset_for_training_arguments`` undoes it safely."""
    if namespace is None or cells is None:
        found_ns, found_cells = notebook_namespace_and_cells()
        namespace = found_ns if namespace is None else namespace
        cells = found_cells if cells is None else cells
    makers = tuple(makers_in_cells(cells))
    holders = holders_in_namespace(namespace)
    only_arguments = (bool(holders) and not accelerator_state
                      and all("TrainingArguments" in {c.__name__ for c in type(v).__mro__} for _, v in holders)
                      and all(ARGUMENTS.match(m.name) for m in makers))
    return StateOrigin(makers=makers, holders=tuple((n, type(v).__name__) for n, v in holders),
                       resettable=tuple(v for _, v in holders) if only_arguments else ())


def reset_for_training_arguments(arguments: Sequence[Any]) -> None:
    """Undo the state TrainingArguments made: Accelerate's shared state is cleared (in place) and
    each argument object forgets its cached device (the ``_setup_devices`` cached property), so
    each rank computes its own with the rank's environment: ``Trainer(args=...)`` does it first
    thing, as does ``args.device``. ``args.distributed_state`` keeps its PartialState, a Borg
    whose shared dict that setup fills again."""
    from accelerate.state import AcceleratorState
    for args in arguments:
        args.__dict__.pop("_setup_devices", None)
    AcceleratorState._reset_state(True)
