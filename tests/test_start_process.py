"""The warm start process (``engines.local.start_process``, ``engines.local.start_server``): every rank that must not
be forked from the notebook is forked from it. Real processes and gloo: the test process is the
notebook. No GPU exists here, so "never initialises CUDA" is read from the start process itself
(torch.cuda.is_initialized() there) rather than from a device."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from notebook_launch import LaunchError, notebook_launcher
from notebook_launch.engines.local import start_client, start_process
from notebook_launch.planning.net import free_port
from helpers.processes import is_start_process

pytestmark = pytest.mark.timeout(300)
LAUNCH_TIMEOUT = 240


def spawn(fn, tmp_path, n=2, **kwargs):
    return notebook_launcher(fn, num_processes=n, start_method="spawn", ui="none", timeout=LAUNCH_TIMEOUT,
                             log_dir=str(tmp_path / f"logs-{time.monotonic_ns()}"), use_port=free_port(),
                             **kwargs)


def who_am_i():
    import os
    import psutil
    return {"pid": os.getpid(), "ppid": os.getppid(), "cmdline": psutil.Process().cmdline(),
            "var": os.environ.get("NL_TEST_LAUNCH_VAR"), "cwd": os.getcwd()}


def running() -> start_process.StartProcess:
    """The start process this test process has (one must have been started)."""
    process = start_process.running()
    assert process is not None, "no start process was started"
    return process


def wait_gone(pid, timeout=30.0):
    deadline = time.monotonic() + timeout
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_spawned_ranks_are_forks_of_the_start_process(tmp_path):
    ranks = spawn(who_am_i, tmp_path)
    starter = running()
    assert starter.alive()
    for rank in ranks:
        assert rank["ppid"] == starter.pid            # its child: it reaps the rank and says how it ended
        assert any("engines.local.start_server" in part for part in rank["cmdline"])   # forked there, not here
    state = starter.state()
    assert state["cuda_initialized"] is False                   # it never holds an accelerator runtime
    assert "torch" in state["modules"] and "torch.distributed" in state["modules"]
    assert state["cwd"] == "/"


def test_ranks_see_the_notebook_as_it_is_at_the_launch_not_as_when_the_start_process_began(tmp_path, monkeypatch):
    start_process.prestart()
    start_process.current()                                     # started and ready before what follows
    modules = tmp_path / "my_modules"
    modules.mkdir()
    (modules / "nl_user_module_for_start_test.py").write_text("VALUE = 'first'\n")
    monkeypatch.syspath_prepend(str(modules))
    monkeypatch.setenv("NL_TEST_LAUNCH_VAR", "set after the start process began")
    workdir = tmp_path / "work"
    workdir.mkdir()
    monkeypatch.chdir(workdir)

    def read_module():
        import importlib
        import os
        module = importlib.import_module("nl_user_module_for_start_test")
        return module.VALUE, os.environ.get("NL_TEST_LAUNCH_VAR"), os.getcwd()

    assert spawn(read_module, tmp_path) == [("first", "set after the start process began", str(workdir))] * 2
    # The user edits the module on disk and changes the environment between two launches.
    (modules / "nl_user_module_for_start_test.py").write_text("VALUE = 'edited on disk'\n")
    monkeypatch.setenv("NL_TEST_LAUNCH_VAR", "changed")
    assert spawn(read_module, tmp_path) == [("edited on disk", "changed", str(workdir))] * 2
    # Nothing the user wrote was ever imported into the start process.
    assert "nl_user_module_for_start_test" not in running().state()["modules"]


def test_a_start_process_that_died_is_replaced_and_the_launch_goes_on_said_once(tmp_path, capfd):
    spawn(who_am_i, tmp_path)
    first = running()
    os.kill(first.pid, signal.SIGKILL)
    first.popen.wait(timeout=30)
    capfd.readouterr()
    ranks = spawn(who_am_i, tmp_path)
    said = capfd.readouterr()
    assert f"the warm start process (pid {first.pid}) had ended (killed by signal 9); starting a new one" in \
        said.err + said.out
    second = running()
    assert second.pid != first.pid and second.alive()
    assert all(any("engines.local.start_server" in p for p in r["cmdline"]) for r in ranks)
    spawn(who_am_i, tmp_path)
    said = capfd.readouterr()
    assert "had ended" not in said.err + said.out                # said once, not at every launch


def test_a_package_that_changed_on_disk_gets_a_fresh_start_process(tmp_path, monkeypatch):
    """A ``%pip install -U`` replaces a package's files: the next launch must not fork from a
    process that holds the old one. A small package in a folder on sys.path stands for it, and
    pip's upgrade is done as pip does it: the old package folder and its dist-info removed, the new
    ones written."""
    import shutil
    site = tmp_path / "site"

    def install(version):
        for old in site.glob("nl_third_party_for_start_test*"):
            shutil.rmtree(old)
        (site / "nl_third_party_for_start_test").mkdir(parents=True)
        (site / "nl_third_party_for_start_test" / "__init__.py").write_text(f"VERSION = {version}\n")
        (site / f"nl_third_party_for_start_test-{version}.dist-info").mkdir()

    install(1)
    monkeypatch.syspath_prepend(str(site))
    start_process.stop()                                        # one that sees the folder on its path
    starter = start_process.current()
    assert starter.ask({"warm": ["nl_third_party_for_start_test"]})["warmed"] == ["nl_third_party_for_start_test"]

    def version():
        import nl_third_party_for_start_test
        return nl_third_party_for_start_test.VERSION

    assert spawn(version, tmp_path) == [1, 1]
    assert start_process.running() is starter                  # unchanged: kept
    time.sleep(0.01)   # a coarse clock still sees the folder change
    install(2)
    assert spawn(version, tmp_path) == [2, 2]
    assert start_process.running() is not starter and starter.popen.wait(timeout=30) == 0   # retired: ended


def test_the_start_process_keeps_no_fd_of_a_run(tmp_path):
    spawn(who_am_i, tmp_path)
    starter = running()
    before = starter.state()["fds"]

    def hold():
        return "done"

    spawn(hold, tmp_path, n=3)
    assert starter.state()["fds"] == before                     # the rank's pipes went with the rank


def test_exit_codes_and_signals_of_adopted_ranks_are_read_as_a_spawned_ranks(tmp_path):
    def end_badly():
        import os
        import signal
        import torch.distributed as dist
        if int(os.environ["RANK"]) == 1:
            os.kill(os.getpid(), signal.SIGSEGV)
        dist.init_process_group("gloo")
        return "never"

    with pytest.raises(LaunchError) as failed:
        spawn(end_badly, tmp_path)
    assert "SIGSEGV" in str(failed.value) and "rank 1" in str(failed.value)

    def exit_3():
        import os
        import time
        if os.environ["RANK"] == "0":
            os._exit(3)
        time.sleep(60)        # stopped after rank 0 fails (an os._exit(0) here raced it to be the failure named)

    with pytest.raises(LaunchError) as failed:
        spawn(exit_3, tmp_path)
    assert "exit code 3" in str(failed.value) and "rank 0" in str(failed.value)


def test_switched_off_ranks_are_fresh_interpreters(tmp_path, monkeypatch):
    monkeypatch.setenv(start_process.SWITCH, "0")
    for rank in spawn(who_am_i, tmp_path):
        assert any("rank.spawn_entry" in part for part in rank["cmdline"])
        assert not any("engines.local.start_server" in part for part in rank["cmdline"])


NOTEBOOK = textwrap.dedent("""
    import json, os, sys, time
    from notebook_launch import notebook_launcher
    from notebook_launch.engines.local import start_process

    def sleeper():
        import time
        time.sleep(600)

    import threading
    threading.Thread(target=lambda: notebook_launcher(sleeper, num_processes=2, start_method="spawn",
                                                      ui="none", log_dir={log_dir!r}), daemon=True).start()
    import psutil

    def cmdline(process):
        try:
            return " ".join(process.cmdline())
        except psutil.Error:   # listed, then gone (the keeper's first process exits at once)
            return ""

    deadline = time.monotonic() + 200
    while time.monotonic() < deadline:
        starter = getattr(start_process.running(), "pid", None)
        ranks = [p.pid for p in psutil.Process().children(recursive=True)
                 if "engines.local.start_server" in cmdline(p) and p.pid != starter]
        if len(ranks) == 2:
            break
        time.sleep(0.05)
    print("STARTED", json.dumps({{"start_process": starter, "ranks": ranks}}), flush=True)
    time.sleep(600)
""")


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_the_start_process_and_its_ranks_end_with_the_notebook_however_it_dies(tmp_path, how):
    notebook = subprocess.Popen([sys.executable, "-c", NOTEBOOK.format(log_dir=str(tmp_path / "logs"))],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert notebook.stdout is not None
    try:
        seen = [notebook.stdout.readline()]
        while seen[-1] and not seen[-1].startswith("STARTED "):   # the launch line and its notes come first
            seen.append(notebook.stdout.readline())
        assert seen[-1], "the notebook ended before its ranks started:\n" + "".join(seen)
        started = json.loads(seen[-1].removeprefix("STARTED "))
        assert len(started["ranks"]) == 2, seen[-1]
        os.kill(notebook.pid, getattr(signal, how))
        notebook.wait(timeout=60)
        for pid in [started["start_process"], *started["ranks"]]:
            assert wait_gone(pid), f"process {pid} outlived the notebook"
    finally:
        if notebook.poll() is None:
            notebook.kill()
            notebook.wait()


def test_is_start_process_helper_sees_the_start_process():
    start_process.prestart()
    start_process.current()   # ready: it has exec'd (just forked, it still had pytest's command line)
    assert is_start_process(psutil.Process(running().pid))


# --- the CUDA guard, softer: a notebook that holds CUDA launches from the start process -------

@pytest.fixture
def cuda_initialized_standin(monkeypatch):
    """The notebook 'initialized CUDA' (a stand-in: no GPU here), as tests/test_guards.py does."""
    from notebook_launch.notebook import cuda_tracking
    monkeypatch.setattr(cuda_tracking, "is_cuda_initialized", lambda: True, raising=True)


def test_a_notebook_holding_cuda_launches_from_the_start_process_unasked(tmp_path, capfd, cuda_initialized_standin):
    ranks = notebook_launcher(who_am_i, num_processes=2, ui="none", use_port=free_port(),
                              log_dir=str(tmp_path / "logs"), timeout=LAUNCH_TIMEOUT)
    starter = running()
    assert all(any("engines.local.start_server" in p for p in r["cmdline"]) and r["ppid"] == starter.pid for r in ranks)
    said = capfd.readouterr()
    assert ("CUDA is initialized in this notebook: ranks start from the warm start process "
            "(start_method='spawn')") in said.out + said.err


def test_persistent_ranks_after_cuda_start_from_the_start_process_unasked(tmp_path, cuda_initialized_standin):
    from notebook_launch import start_ranks
    with start_ranks(2, ui="none", use_port=free_port(), log_dir=str(tmp_path / "logs")) as ranks:
        for pid in ranks.pids:
            assert is_start_process(psutil.Process(pid)) and psutil.Process(pid).ppid() == running().pid
        assert ranks.run(lambda: 1) == [1, 1]


def test_a_poisoned_fork_with_gpus_plans_the_start_process(monkeypatch):
    """A FAKE CUDA build seeing two FAKE GPUs, asked is_available(): the plan starts its ranks from
    the start process (no rank is started: a fake GPU could not run one)."""
    import torch
    from helpers.fake_cuda_build_standin import fake_gpus_tracked
    from notebook_launch.planning import net
    from notebook_launch.planning.options import launch_options
    from notebook_launch.planning.prepare import plan_launch
    with fake_gpus_tracked(monkeypatch):
        assert torch.cuda.is_available()
        target, plan, run_id = plan_launch(launch_options(function=who_am_i, num_processes=2, use_port=free_port()))
        net.release_claims(run_id)
        assert target.start_method == plan.start_method == "spawn" and target.device_kind == "cuda"
        assert any("the CUDA runtime was already used in this notebook: ranks start from the warm start process"
                   in note for note in plan.notes)


def test_with_the_start_process_off_a_notebook_holding_cuda_is_still_refused(monkeypatch, cuda_initialized_standin):
    from notebook_launch import GuardError
    monkeypatch.setenv(start_process.SWITCH, "0")
    with pytest.raises(GuardError, match="CUDA is already initialized"):
        notebook_launcher(who_am_i, num_processes=2, ui="none")


def test_a_cuda_tensor_in_the_job_is_named_before_anything_starts(monkeypatch, tmp_path):
    """A tensor on the notebook's GPU would reach a fresh rank as a CPU copy: refused, naming where
    it is. No GPU here: ``tensor_device`` is told that marked CPU tensors are on cuda:0 (FAKE)."""
    import torch

    from notebook_launch import LaunchArgumentError
    from notebook_launch.wire import pickling
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    fake_cuda_tensors = {id(model[1].weight)}   # the model outlives the test's launches: ids stay its own
    real = pickling.tensor_device
    monkeypatch.setattr(pickling, "tensor_device",
                        lambda t: "cuda:0" if id(t) in fake_cuda_tensors else real(t))
    start_process.stop()

    def train(m, lr=0.1):
        return lr

    with pytest.raises(LaunchArgumentError) as refused:
        spawn(train, tmp_path, args=(model,))
    message = str(refused.value)
    assert message.startswith("args[0][1].weight is a tensor on cuda:0 (shape (1, 2), torch.float32)"), message
    assert "create it inside the launched function" in message and ".cpu()" in message

    def closes_over():
        return model

    with pytest.raises(LaunchArgumentError,
                       match=r"the function \(its closure variable 'model'\)\[1\].weight is a tensor on cuda:0"):
        spawn(closes_over, tmp_path)
    assert start_process.running() is None   # refused before the start process was even asked for ranks


# --- when it starts: %load_ext where launches will likely need it, the first such launch otherwise ---

@pytest.mark.parametrize("devices, environ, version, expected", [
    ((), {}, (3, 11), None),                                           # a CPU machine: the first launch starts it
    (("nvidia0", "nvidiactl"), {}, (3, 11), "an NVIDIA GPU"),
    (("nvidiactl",), {}, (3, 11), None),                              # a driver without a device
    (("kfd",), {}, (3, 11), "an AMD GPU (ROCm)"),
    (("accel0",), {}, (3, 11), "a TPU"),
    (("vfio/0",), {}, (3, 11), "a TPU"),
    ((), {}, (3, 14), "Python 3.14 (forkserver by default)"),
    ((), {"NOTEBOOK_LAUNCH_START_PROCESS": "1"}, (3, 11), "NOTEBOOK_LAUNCH_START_PROCESS=1"),
    (("nvidia0",), {"NOTEBOOK_LAUNCH_START_PROCESS": "0"}, (3, 11), None),   # switched off
])
def test_why_start_early_reads_the_machine(tmp_path, devices, environ, version, expected):
    """A FAKE /dev tree (device nodes stand in as plain files)."""
    (tmp_path / "dev").mkdir()
    for name in devices:
        (tmp_path / "dev" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "dev" / name).write_text("")
    assert start_process.why_start_early(environ, root=str(tmp_path), version=version) == expected


LOAD_EXT_CELLS = (
    "%load_ext notebook_launch",
    "from notebook_launch.engines.local import start_process\n"
    "started = start_process.running()\n"
    "print('STARTED' if started is not None else 'NOT STARTED')\n"
    "if started is not None:\n"
    "    print('READY', sorted(started.wait_ready()))",
)


@pytest.mark.parametrize("switch", ["1", ""])
def test_load_ext_starts_it_where_it_will_likely_be_needed(tmp_path, monkeypatch, switch):
    from helpers.nbutil import cell_text, make_notebook, run_notebook
    monkeypatch.setenv(start_process.SWITCH, switch)   # no GPU here: "1" stands for one (or Python 3.14)
    expected = "STARTED" if start_process.why_start_early() else "NOT STARTED"
    assert expected == "STARTED" or switch == ""
    nb = run_notebook(make_notebook(*LOAD_EXT_CELLS), cwd=str(tmp_path), timeout=300)
    text = cell_text(nb.cells[1])
    assert text.splitlines()[0] == expected, text
    if expected == "STARTED":
        assert "READY ['fingerprints', 'pid']" in text, text


def test_a_launch_with_more_fds_than_one_message_carries_goes_in_several_requests():
    """SCM_RIGHTS carries at most 253 fds a message; a rank brings up to 7."""
    ranks = [start_process.RankRequest(["--local-rank", str(i)], {}, {n: n for n in range(7)}) for i in range(80)]
    batches = start_client._batches(ranks)
    assert [len(b) for b in batches] == [36, 36, 8]
    assert [r for b in batches for r in b] == ranks


def test_the_panel_header_shows_the_start_process_memory(tmp_path):
    from notebook_launch.record.proc_usage import machine_memory
    from notebook_launch.record.resources import helper_pids, machine_memory_text
    start_process.prestart()
    starter = start_process.current()
    assert helper_pids()[start_process.HELPER_NAME] == starter.pid
    memory = machine_memory(helper_pids())
    assert memory is not None
    text = machine_memory_text(memory)
    assert ", start process " in text and "MiB" in text.split(", start process ")[1], text
    start_process.stop()
    assert start_process.HELPER_NAME not in helper_pids()


def test_spawn_entry_reads_only_its_launchers_arguments():
    from notebook_launch.rank.spawn_entry import parse_args
    args = parse_args(["--payload-fd", "5", "--local-rank", "1", "--events-fd", "7", "--parent-pid", "9",
                       "--tensors-fd", "12"])
    assert (args.payload_fd, args.local_rank, args.events_fd, args.parent_pid, args.tensors_fd, args.answers_fd) == \
        (5, 1, 7, 9, 12, None)
    for bad in (["--payload-fd"], ["--bogus", "1", "--payload-fd", "5"], ["--local-rank", "1"]):
        with pytest.raises(SystemExit):
            parse_args(bad)


def test_a_request_that_fails_part_way_leaves_no_rank_of_the_earlier_part_running(tmp_path, monkeypatch, capfd):
    """A launch whose ranks go in two requests, the second failing: the ranks of the first are ended
    (every rank then starts as a fresh Python; none may run twice)."""
    start_process.prestart()
    starter = start_process.current()
    monkeypatch.setattr(start_client, "_batches", lambda ranks: [[rank] for rank in ranks])   # one rank a request
    real, calls, first = starter.ask_with_fds, [], []

    def second_fails(message, fds=(), timeout=start_process.REQUEST_WAIT):
        calls.append(message)
        if "ranks" in message and sum("ranks" in m for m in calls) == 2:
            raise start_process.StartProcessUnavailable("the second request failed (a stand-in)")
        answer, pidfds = real(message, fds, timeout)
        first.extend(answer.get("pids", []))
        return answer, pidfds

    def forks_of_the_start_process_hang():
        import time
        if any("engines.local.start_server" in part for part in who_am_i()["cmdline"]):
            time.sleep(600)   # a rank left running would stay
        return who_am_i()

    monkeypatch.setattr(starter, "ask_with_fds", second_fails)
    ranks = spawn(forks_of_the_start_process_hang, tmp_path)
    assert all(any("rank.spawn_entry" in part for part in r["cmdline"]) for r in ranks)   # fresh Pythons
    assert len(first) == 1 and wait_gone(first[0], timeout=10), "the first request's rank was left running"
    assert "could not start the ranks (the second request failed" in capfd.readouterr().err
