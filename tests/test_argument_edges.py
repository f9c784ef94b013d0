"""Arguments at the edges: each bad one is a LaunchArgumentError before anything starts;
integral numbers of any type (NumPy's) are accepted, as Accelerate accepts them."""
import os

import numpy as np
import pytest

from notebook_launch import LaunchArgumentError, notebook_launcher


def must_not_run():
    raise AssertionError("a rank started despite a bad argument")


def rank_of_each():
    return int(os.environ["RANK"])


@pytest.mark.parametrize("kwargs,message", [
    ({"timeout": float("nan")}, "timeout must be a number of seconds > 0, or None; got nan"),
    ({"timeout": -5}, "timeout must be a number of seconds > 0"),
    ({"monitor_interval": float("nan")}, "monitor_interval must be a finite number of seconds > 0; got nan"),
    ({"monitor_interval": float("inf")}, "monitor_interval must be a finite number of seconds > 0"),
    ({"log_dir": ""}, "log_dir must be a folder path or None"),
    ({"log_dir": 3}, "log_dir must be a folder path or None"),
    ({"master_addr": None}, "master_addr must be a host name or IP address"),
    ({"master_addr": ""}, "master_addr must be a host name or IP address"),
    ({"num_processes": 2.0}, "num_processes must be a whole number"),
    ({"num_processes": np.float64(2)}, "num_processes must be a whole number"),
    ({"num_processes": 10_000}, "num_processes=10000"),
    ({"num_nodes": np.int64(0)}, "num_nodes must be >= 1"),
    ({"lines_per_second": 0}, "lines_per_second must be a whole number >= 1"),
    ({"lines_per_second": 2.5}, "lines_per_second must be a whole number >= 1"),
    ({"lines_per_second": True}, "lines_per_second must be a whole number >= 1"),
    ({"lines_per_second": "every"}, "or 'all' for every line; got 'every'"),
    # a rendezvous timeout is checked on every launch (Ray waits that long for its placement too)
    ({"rdzv_timeout": -1}, "rdzv_timeout must be a number of seconds > 0"),
    ({"rdzv_conf": {"join_timeout": "soon"}}, "rdzv_conf['join_timeout'] must be a number of seconds"),
])
def test_bad_argument_fails_before_anything_starts(kwargs, message, tmp_path, capsys):
    args = {"num_processes": 2, "log_dir": str(tmp_path / "logs"), **kwargs}
    with pytest.raises(LaunchArgumentError) as info:
        notebook_launcher(must_not_run, **args)
    assert message in str(info.value)
    assert "notebook_launch: " not in capsys.readouterr().out, "nothing may start (no launch line)"
    assert not (tmp_path / "logs").exists(), "no log folder may be made"


def test_log_dir_that_is_a_file_is_refused(tmp_path):
    target = tmp_path / "a_file"
    target.write_text("")
    with pytest.raises(LaunchArgumentError, match="log_dir=.* cannot be used"):
        notebook_launcher(must_not_run, num_processes=1, log_dir=str(target / "sub"))


def test_numpy_integers_are_accepted(log_dir):
    results = notebook_launcher(rank_of_each, num_processes=np.int64(2), max_restarts=np.int32(0),
                                node_rank=np.int64(0), num_nodes=np.int8(1), log_dir=log_dir)
    assert results == [0, 1]


def test_an_infinite_timeout_means_no_timeout(log_dir):
    assert notebook_launcher(rank_of_each, num_processes=1, timeout=float("inf"), log_dir=log_dir) == [0]


def test_ten_thousand_cpu_ranks_fail_before_opening_any_log(tmp_path, monkeypatch):
    monkeypatch.setenv("NOTEBOOK_LAUNCH_LOG_DIR", str(tmp_path / "runs"))
    fds_before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(LaunchArgumentError) as info:
        notebook_launcher(must_not_run, num_processes=10_000)
    assert "num_processes=10000" in str(info.value)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    assert len(os.listdir("/proc/self/fd")) == fds_before


def test_options_are_resolved_once_with_notebook_launchers_defaults(monkeypatch):
    """launch_options gives every field notebook_launcher's default, resolves the rendezvous
    timeout and the line budget, and what runs after it checks nothing again."""
    from notebook_launch.planning import options as options_module
    from notebook_launch.engines.elastic import rendezvous
    opts = options_module.launch_options(function=print, rdzv_conf={"join_timeout": 30}, lines_per_second="all")
    assert (opts.ui, opts.port_is_default, opts.display_ranks, opts.rendezvous_timeout) == ("auto", True,
                                                                                           frozenset({0}), 30)
    assert opts.lines_per_second is None
    assert options_module.launch_options(function=print).lines_per_second == 200
    assert options_module.launch_options(function=print, rdzv_timeout=7).rendezvous_timeout == 7
    assert options_module.launch_options(function=print).rendezvous_timeout == options_module.DEFAULT_RDZV_TIMEOUT

    def checked_again(**kwargs):
        raise AssertionError("validate_rendezvous ran a second time")
    monkeypatch.setattr(options_module, "validate_rendezvous", checked_again)
    assert rendezvous.settings_for(opts, port=29501).timeout == 30


@pytest.mark.parametrize("given,budget", [(5, 5), ("all", None), (np.int64(30), 30)])
def test_lines_per_second_reaches_the_display(given, budget, log_dir):
    """notebook_launcher(lines_per_second=) is the cell's line budget of the display the run
    chooses ("all": None, every line): its parameters as the entry point takes them, to the
    display its launch's session makes."""
    from notebook_launch.display.html import HtmlDisplay
    from notebook_launch.wire.plan import build_plan
    from notebook_launch.planning.prepare import entry_options
    from notebook_launch.scaffold.session import Session
    options = entry_options({"function": rank_of_each, "num_processes": 1, "lines_per_second": given,
                             "ui": "html", "log_dir": log_dir})
    plan = build_plan(num_processes=1, num_nodes=1, node_rank=0, master_addr="127.0.0.1", master_port=29500,
                      device_kind="cpu", mixed_precision="no", start_method="fork", run_id="r", user_env={},
                      cpu_count=4)
    session = Session.for_launch(plan, options, run_id="r", backend="fork")
    session.logs.close()
    from helpers.panel_helpers import panel_of
    display = panel_of(session.display)
    assert isinstance(display, HtmlDisplay) and display.lines is not None
    assert display.lines.budget == budget


def test_ui_is_a_display_name_or_a_display_of_ones_own():
    """``ui=``: one of the names, or a Display the caller made (driven as the run's display);
    anything else is refused before anything starts, saying both."""
    from notebook_launch.display.base import Display
    from notebook_launch.planning.options import launch_options
    own = Display()
    assert launch_options(function=rank_of_each, ui=own).ui is own
    assert launch_options(function=rank_of_each, ui="text").ui == "text"
    for bad in ("fancy", Display, 3):
        with pytest.raises(LaunchArgumentError, match=r"^ui=.* is not valid; choose one of 'auto', .*, or pass a "
                                                      r"display of your own \(an instance of notebook_launch\."
                                                      r"display\.Display\)$"):
            launch_options(function=rank_of_each, ui=bad)
