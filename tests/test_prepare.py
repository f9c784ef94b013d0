"""Preparation has one home (``notebook_launch/planning/prepare.py``): every entry point makes its
``LaunchOptions`` through ``prepare.entry_options`` (the only caller of ``launch_options`` in
the package), each argument is checked in one place, and an entry point's parameter can
never be dropped on the way to the options."""
from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from notebook_launch import notebook_launcher, start_ranks
from notebook_launch.planning.options import DEFAULT_USE_PORT, launch_options
from notebook_launch.planning.prepare import ENTRY_POINT_ONLY, OPTION_NAMES, entry_options
from notebook_launch.rank.serve import serve_calls

PACKAGE = Path(__file__).resolve().parents[1] / "notebook_launch"


def calls_in_package(function_name: str) -> list[str]:
    """``module:function`` of every call of ``function_name`` (by name or attribute) in the package."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for outer in ast.walk(tree):
            if not isinstance(outer, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(outer):
                if isinstance(node, ast.Call):
                    func = node.func
                    called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
                    if called == function_name:
                        found.append(f"{path.relative_to(PACKAGE)}:{outer.name}")
    return sorted(set(found))


def test_launch_options_is_called_from_one_place():
    assert calls_in_package("launch_options") == ["planning/prepare.py:entry_options"]


def test_each_argument_is_checked_in_one_place():
    """interrupt_grace once (start_ranks, for both kinds of pool); the displays take checked
    values (options.py raises for a bad one, display code may only assert); plan_launch lives
    in planning/prepare.py alone."""
    assert len(calls_in_package("validate_interrupt_grace")) == 1, calls_in_package("validate_interrupt_grace")
    raising = []
    for path in sorted((PACKAGE / "display").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and isinstance(node.exc.func, ast.Name) \
                    and node.exc.func.id in ("ValueError", "TypeError", "LaunchArgumentError"):
                raising.append(f"{path.name}:{node.lineno}")
    assert not raising, f"display/ checks arguments again: {raising}"
    homes = [str(path.relative_to(PACKAGE)) for path in sorted(PACKAGE.rglob("*.py"))
             for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.FunctionDef) and node.name == "plan_launch"]
    assert homes == ["planning/prepare.py"]


@pytest.mark.parametrize("entry_point", [notebook_launcher, start_ranks])
def test_every_parameter_of_an_entry_point_reaches_the_options(entry_point):
    """Each parameter is a launch option or one the entry point uses itself; an option it leaves
    out gets notebook_launcher's default, so its options default as notebook_launcher's do."""
    parameters = inspect.signature(entry_point).parameters
    assert set(parameters) <= OPTION_NAMES | ENTRY_POINT_ONLY
    builder_defaults = inspect.signature(launch_options).parameters
    for name, parameter in inspect.signature(notebook_launcher).parameters.items():
        if name in OPTION_NAMES and name not in ("function", "use_port"):
            assert builder_defaults[name].default == parameter.default, name
    assert builder_defaults["use_port"].default is None   # None: notebook_launcher's DEFAULT_USE_PORT
    assert inspect.signature(notebook_launcher).parameters["use_port"].default is DEFAULT_USE_PORT


def test_start_ranks_defaults_make_the_options_written_out_before():
    """What start_ranks passed keyword by keyword (issue 31 item 5) is what its defaults now give."""
    defaults = {name: p.default for name, p in inspect.signature(start_ranks).parameters.items()}
    built = entry_options(defaults, function=serve_calls, called_as_given=False)
    assert built == launch_options(
        function=serve_calls, args=(), num_processes=None, mixed_precision="no", use_port=DEFAULT_USE_PORT,
        master_addr="127.0.0.1", node_rank=0, num_nodes=1, rdzv_backend="static", rdzv_endpoint="",
        rdzv_conf=None, rdzv_id="none", max_restarts=0, monitor_interval=0.1, log_line_prefix_template=None,
        kwargs=None, start_method=None, timeout=None, log_dir=None, ui="auto", rdzv_timeout=None,
        display_ranks=None, stall_after=defaults["stall_after"], lines_per_second=defaults["lines_per_second"],
        called_as_given=False)


def test_a_parameter_that_is_no_option_is_refused():
    with pytest.raises(TypeError, match="not launch options: grace_period"):
        entry_options({"function": print, "grace_period": 3})
    with pytest.raises(TypeError, match="not launch options: cluster"):
        entry_options({}, function=print, cluster=None)   # an entry point's own name is not an override
    assert entry_options({"function": print, "cluster": None, "interrupt_grace": 3.0}).function is print
