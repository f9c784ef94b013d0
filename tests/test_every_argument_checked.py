"""Every parameter of every entry point is checked for its type and range before anything starts
(issue 32 item 6), and a launch's ``args``/``kwargs`` must fit the function's signature (issue 35
item 4): NaN, inf, negatives, bools where numbers are meant, keys that are not names, control
characters and NUL in strings. Each check is driven from the real entry point, and each test
asserts that nothing started: no child process, no run folder, no launch line."""
import functools
import math
import os

import pytest

from notebook_launch import LaunchArgumentError, RayCluster, notebook_launcher, start_ranks
from notebook_launch.planning.net import free_port
from notebook_launch.magics import ranks as ranks_magic_module
from helpers.processes import children


def must_not_run(*args, **kwargs):
    raise AssertionError("a rank started despite a bad argument")


def train(lr, epochs=1):
    return lr * epochs


@pytest.fixture(autouse=True)
def children_before():
    """The processes this test process had before the test (the module's pool's ranks among them)."""
    return {p.pid for p in children()}


def nothing_started(tmp_path, capsys, before):
    assert {p.pid for p in children()} <= before, "no rank may start"
    assert not (tmp_path / "logs").exists(), "no run folder may be made"
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    assert "notebook_launch: " not in capsys.readouterr().out, "no launch line"
    return True


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("kwargs,message", [
    # numbers: NaN, inf, negative, bool where a whole number is meant
    ({"num_processes": -1}, "num_processes must be >= 1"),
    ({"num_processes": True}, "num_processes must be a whole number"),
    ({"max_restarts": -1}, "max_restarts must be >= 0"),
    ({"max_restarts": True}, "max_restarts must be a whole number"),
    ({"node_rank": 0.0}, "node_rank must be a whole number"),
    ({"use_port": True}, "use_port must be a TCP port number"),
    ({"use_port": 29500.7}, "use_port must be a TCP port number"),
    ({"use_port": "29_500"}, "use_port must be a TCP port number"),
    ({"use_port": -1}, "use_port must be a TCP port number"),
    ({"stall_after": NAN}, "stall_after must be a number of seconds > 0"),
    ({"stall_after": -1}, "stall_after must be a number of seconds > 0"),
    ({"timeout": True}, "timeout must be a number of seconds > 0"),
    ({"rdzv_timeout": INF}, "rdzv_timeout must be a number of seconds > 0"),
    ({"rdzv_timeout": NAN}, "rdzv_timeout must be a number of seconds > 0"),
    ({"rdzv_conf": {"join_timeout": NAN}}, "rdzv_conf['join_timeout'] must be a number of seconds, finite and > 0"),
    ({"rdzv_conf": {"join_timeout": INF}}, "rdzv_conf['join_timeout'] must be a number of seconds, finite and > 0"),
    ({"rdzv_conf": {"timeout": -5}}, "rdzv_conf['timeout'] must be a number of seconds, finite and > 0"),
    ({"rdzv_conf": {"timeout": True}}, "rdzv_conf['timeout'] must be a number of seconds, finite and > 0"),
    ({"display_ranks": [-1]}, "is not a rank"),
    # mappings whose keys are not names
    ({"kwargs": {1: 2}}, "not a parameter name: 1"),
    ({"kwargs": {"lr": 1, b"lr": 2}}, "not a parameter name: b'lr'"),
    ({"kwargs": {"lr": 1, "two words": 2}}, "got an unexpected keyword argument 'two words'"),
    ({"rdzv_conf": {5: 1}}, "not an option name: 5"),
    # strings with control characters, NUL, spaces, or not strings at all
    ({"master_addr": "127.0.0.1\0evil"}, "master_addr='127.0.0.1\\x00evil' holds control characters"),
    ({"master_addr": "localhost\n"}, "holds control characters"),
    ({"master_addr": "my host"}, "master_addr='my host' holds spaces"),
    ({"master_addr": b"127.0.0.1"}, "master_addr must be a host name or IP address"),
    ({"log_dir": "runs\0x"}, "log_dir='runs\\x00x' holds a NUL character"),
    ({"rdzv_endpoint": "host:1\0"}, "rdzv_endpoint='host:1\\x00' holds control characters"),
    ({"rdzv_endpoint": None}, "rdzv_endpoint must be a 'host:port' string"),
    ({"rdzv_id": "run\x1b[2J"}, "rdzv_id='run\\x1b[2J' holds control characters"),
    ({"log_line_prefix_template": 5}, "log_line_prefix_template must be a str"),
    # mixed_precision: only its names, as strings
    ({"mixed_precision": True}, "mixed_precision must be a string"),
    ({"mixed_precision": 16}, "mixed_precision must be a string"),
    ({"mixed_precision": "fp32"}, "mixed_precision='fp32' is not valid"),
    ({"mixed_precision": b"bf16"}, "mixed_precision must be a string"),
])
def test_notebook_launcher_checks_every_argument_first(kwargs, message, tmp_path, capsys, children_before):
    args = {"num_processes": 2, "log_dir": str(tmp_path / "logs"), "kwargs": {"lr": 0.1}, **kwargs}
    with pytest.raises(LaunchArgumentError) as info:
        notebook_launcher(train, **args)
    assert message in str(info.value)
    assert nothing_started(tmp_path, capsys, children_before)


@pytest.mark.parametrize("function,args,kwargs,message", [
    (train, (), None, "train(lr, epochs=1) cannot be called with args=() and kwargs={}: "
                      "missing a required argument: 'lr'"),
    (train, (0.1, 2, 3), None, "too many positional arguments"),
    (train, (), {"lr": 0.1, "momentum": 0.9}, "got an unexpected keyword argument 'momentum'"),
    (train, (0.1,), {"lr": 0.1}, "multiple values for argument 'lr'"),
    (functools.partial(train, 0.1), (0.2,), {"epochs": 3}, "multiple values for argument 'epochs'"),
    (lambda *, steps: steps, (), None, "missing a required argument: 'steps'"),
])
def test_arguments_that_do_not_fit_the_signature_are_named_before_any_rank_starts(
        function, args, kwargs, message, tmp_path, capsys, children_before):
    """Issue 35 item 4: before, every rank started and rank 0 failed with a TypeError."""
    with pytest.raises(LaunchArgumentError) as info:
        notebook_launcher(function, args=args, kwargs=kwargs, num_processes=2, log_dir=str(tmp_path / "logs"))
    assert message in str(info.value)
    assert "nothing was started" in str(info.value)
    assert nothing_started(tmp_path, capsys, children_before)


class Trainer:
    """A callable object: its ``__call__``'s signature is the one checked."""

    def __call__(self, lr):
        return lr * 2


def adds_its_own_argument(function):
    """A decorator that passes an argument itself: the wrapped signature would refuse a call that works."""
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        return function(10, *args, **kwargs)
    return wrapper


@adds_its_own_argument
def scaled(factor, lr):
    return factor * lr


@pytest.mark.parametrize("function,args,kwargs,expected", [
    (functools.partial(train, epochs=3), (2,), None, 6),
    (Trainer(), (), {"lr": 4}, 8),
    (scaled, (3,), None, 30),          # wraps: checked as the wrapper's (*args, **kwargs)
    (max, ([4, 7],), None, 7),         # a C function with no readable signature: not checked
    (lambda **options: sorted(options), (), {"two words": 1, "lr": 2}, ["lr", "two words"]),   # any str key
])
def test_calls_that_work_are_never_refused(function, args, kwargs, expected, log_dir):
    assert notebook_launcher(function, args=args, kwargs=kwargs, num_processes=1, ui="none",
                             log_dir=log_dir) == [expected]


@pytest.mark.parametrize("kwargs,message", [
    ({"interrupt_grace": NAN}, "interrupt_grace must be a finite number of seconds > 0"),
    ({"interrupt_grace": INF}, "interrupt_grace must be a finite number of seconds > 0"),
    ({"interrupt_grace": -1}, "interrupt_grace must be a finite number of seconds > 0"),
    ({"interrupt_grace": True}, "interrupt_grace must be a finite number of seconds > 0"),
    ({"interrupt_grace": "3"}, "interrupt_grace must be a finite number of seconds > 0"),
    ({"master_addr": "127.0.0.1\0"}, "holds control characters"),
    ({"mixed_precision": 1}, "mixed_precision must be a string"),
    ({"use_port": False}, "use_port must be a TCP port number"),
    ({"stall_after": NAN}, "stall_after must be a number of seconds > 0"),
    ({"log_dir": "\0"}, "holds a NUL character"),
])
def test_start_ranks_checks_every_argument_first(kwargs, message, tmp_path, capsys, children_before):
    args = {"log_dir": str(tmp_path / "logs"), **kwargs}
    with pytest.raises(LaunchArgumentError) as info:
        start_ranks(2, ui="none", **args)
    assert message in str(info.value)
    assert nothing_started(tmp_path, capsys, children_before)


@pytest.mark.parametrize("kwargs,message", [
    ({"interrupt_grace": NAN}, "interrupt_grace must be a finite number of seconds > 0"),
    ({"master_addr": "x\0"}, "holds control characters"),
    ({"start_method": "spawn"}, "cannot be combined with cluster="),
])
def test_start_ranks_on_a_cluster_checks_the_same_arguments_before_connecting(kwargs, message, tmp_path, capsys,
                                                                            children_before):
    """Ray is never asked (the address names no cluster that could answer): the checks come first."""
    with pytest.raises(LaunchArgumentError) as info:
        start_ranks(2, ui="none", log_dir=str(tmp_path / "logs"), cluster=RayCluster(address="127.0.0.1:9"),
                    **kwargs)
    assert message in str(info.value)
    assert nothing_started(tmp_path, capsys, children_before)


@pytest.mark.parametrize("fields,message", [
    ({"resources_per_rank": {"CPU": NAN}}, "finite amounts >= 0; got 'CPU': nan"),
    ({"resources_per_rank": {"CPU": INF}}, "finite amounts >= 0; got 'CPU': inf"),
    ({"resources_per_rank": {"CPU": -1}}, "finite amounts >= 0"),
    ({"resources_per_rank": {"CPU": True}}, "finite amounts >= 0"),
    ({"resources_per_rank": {3: 1}}, "finite amounts >= 0; got 3: 1"),
    ({"address": "head:6379\0"}, "without spaces or control characters"),
    ({"address": "  "}, "RayCluster(address=...) must be"),
    ({"runtime_env": {1: "x"}}, "not a field name: 1"),
    ({"runtime_env": {"env_vars": {"OMP_NUM_THREADS": 4}}}, "must map variable names to string values"),
    ({"runtime_env": {"env_vars": {1: "4"}}}, "must map variable names to string values"),
    ({"runtime_env": {"env_vars": {"A=B": "4"}}}, "must map variable names to string values"),
    ({"runtime_env": {"env_vars": {"A": "x\0y"}}}, "must map variable names to string values"),
])
def test_ray_cluster_fields_are_checked_when_made(fields, message):
    with pytest.raises(LaunchArgumentError) as info:
        RayCluster(**fields)
    assert message in str(info.value)


@pytest.fixture(scope="module")
def pool():
    with start_ranks(2, ui="none", use_port=free_port()) as ranks:
        yield ranks


@pytest.mark.parametrize("call,message", [
    (lambda r: r.run(train), "missing a required argument: 'lr'"),
    (lambda r: r.run(train, kwargs={1: 2}), "not a parameter name: 1"),
    (lambda r: r.run(train, args=(1,), kwargs={"momentum": 2}), "unexpected keyword argument 'momentum'"),
    (lambda r: r.run(train, args=(1,), timeout=NAN), "timeout must be a number of seconds > 0"),
    (lambda r: r.run(train, args=(1,), stall_after=-3), "stall_after must be a number of seconds > 0"),
    (lambda r: r.run(train, args=(1,), lines_per_second=True), "lines_per_second must be a whole number"),
    (lambda r: r.push(**{"not a name": 1}), "not names: 'not a name'"),
    (lambda r: r.pull("x", timeout=INF * 0), "timeout must be a number of seconds > 0"),
    (lambda r: r.run_cell(b"x = 1", "<cell>"), "run_cell(source=...) must be the cell's code as a str"),
    (lambda r: r.run_cell("x = 1", "<cell\0>"), "run_cell(filename=...)="),
    (lambda r: r.run_cell("x = 1", "<cell>", {2: 3}), "run_cell(values=...) must be a dict of variable names"),
])
def test_a_persistent_call_checks_its_arguments_before_the_ranks_run_it(pool, call, message):
    calls = pool.calls
    with pytest.raises(LaunchArgumentError) as info:
        call(pool)
    assert message in str(info.value)
    assert pool.calls == calls, "no call may reach the ranks"
    assert pool.alive and pool.run(train, args=(2,)) == [2, 2]


def times(x, factor=2):
    return x * factor


def test_a_function_changed_between_calls_is_checked_as_it_is_now(pool):
    """The signature read for a call is kept for the next (issue 45), but never past a change:
    its defaults, its code, or a new function under the same name."""
    assert pool.run(times, args=(3,)) == [6, 6]
    saved = times.__defaults__
    try:
        times.__defaults__ = None
        with pytest.raises(LaunchArgumentError, match="missing a required argument: 'factor'"):
            pool.run(times, args=(3,))
        times.__defaults__ = (5,)
        assert len(pool.run(times, args=(3,))) == 2   # accepted again (the ranks import their own times)
    finally:
        times.__defaults__ = saved
    code = times.__code__
    try:
        times.__code__ = (lambda x: x).__code__
        with pytest.raises(LaunchArgumentError, match="too many positional arguments"):
            pool.run(times, args=(3, 4))
    finally:
        times.__code__ = code
    assert pool.run(times, args=(3, 4)) == [12, 12]


@pytest.mark.parametrize("line,message", [
    ("start -n 2 --grace nan", "interrupt_grace must be a finite number of seconds > 0 (how long"),
    ("start -n 2 --grace inf", "before every rank is stopped); got inf"),
    ("start -n 2 --timeout nan", "timeout must be a number of seconds > 0, or None; got nan"),
    ("start -n 2 --stall-after -1", "stall_after must be a number of seconds > 0"),
    ("start -n -2", "num_processes must be >= 1"),
    ("start -n 2 --mixed-precision fp32", "mixed_precision='fp32' is not valid"),
    ("start -n 2 --port 29500.5", "use_port must be a TCP port number"),
    ("start -n 2 --grace soon", "--grace must be a number of seconds"),
])
def test_the_ranks_magic_checks_through_the_same_checkers(line, message, tmp_path, capsys, children_before):
    with pytest.raises(LaunchArgumentError) as info:
        ranks_magic_module.ranks_magic(None, f"{line} --log-dir {tmp_path / 'logs'}")
    assert message in str(info.value)
    assert ranks_magic_module._active is None
    assert nothing_started(tmp_path, capsys, children_before)


@pytest.mark.parametrize("line,message", [
    ("-n 2 --timeout nan", "timeout must be a number of seconds > 0, or None; got nan"),
    ("-n 2 --stall-after inf", None),   # inf: not watched, as None; the launch runs
    ("-n 0", "num_processes must be >= 1"),
    ("-n 2 --port 0", "use_port must be a TCP port number"),
    ("-n 2 --display-ranks -1", "is not a rank"),
])
def test_the_launch_magic_checks_through_the_same_checkers(line, message, tmp_path, capsys, children_before):
    from notebook_launch.magics.launch import launch_cell
    cell = "import os\nresult = int(os.environ['RANK'])"
    if message is None:
        launch_cell(None, f"{line} --ui none --log-dir {tmp_path / 'ran'}", cell)
        return
    with pytest.raises(LaunchArgumentError) as info:
        launch_cell(None, f"{line} --log-dir {tmp_path / 'logs'}", "raise AssertionError('a rank started')")
    assert message in str(info.value)
    assert nothing_started(tmp_path, capsys, children_before)


def test_checks_allow_what_worked_before(log_dir):
    """Not refused: numeric strings in rdzv_conf (torchrun's --rdzv-conf gives text), a port as digits, an
    uppercase precision name, Accelerate's PrecisionType."""
    from accelerate.utils import PrecisionType
    from notebook_launch.planning.options import launch_options
    assert launch_options(function=train, args=(1,), rdzv_conf={"join_timeout": "30"}).rendezvous_timeout == 30
    assert launch_options(function=train, args=(1,), use_port="29511").port == 29511
    assert launch_options(function=train, args=(1,), mixed_precision="BF16").mixed_precision == "bf16"
    assert launch_options(function=train, args=(1,), mixed_precision=PrecisionType.FP16).mixed_precision == "fp16"
    assert math.isclose(launch_options(function=train, args=(1,), rdzv_timeout=1.5).rendezvous_timeout, 1.5)
    assert notebook_launcher(os.getpid, num_processes=1, ui="none", log_dir=log_dir)[0] != os.getpid()


def test_a_call_that_fit_once_is_known_and_one_that_does_not_is_still_refused():
    """Issue 45: the shapes of calls that fit a function are kept with its signature (a warm
    ``ranks.run(f)`` bound the same empty call every time); what binding looks at is the
    positional count and the keyword names, so a value never changes the verdict, and a changed
    signature (new defaults) is read again."""
    from notebook_launch.planning.option_checks import validate_call

    def step(lr, epochs=1):
        return lr, epochs

    for _ in range(2):
        validate_call(step, (0.1,), None)
        validate_call(step, (), {"lr": 0.1})
        with pytest.raises(LaunchArgumentError, match="missing a required argument: 'lr'"):
            validate_call(step, (), None)
        with pytest.raises(LaunchArgumentError, match="too many positional arguments"):
            validate_call(step, (0.1, 2, 3), None)
    step.__defaults__ = (0.1, 1)   # lr has a default now: the empty call fits
    validate_call(step, (), None)
    step.__defaults__ = None       # none: epochs is required, so a call that fit before is refused
    with pytest.raises(LaunchArgumentError, match="missing a required argument"):
        validate_call(step, (0.1,), None)
