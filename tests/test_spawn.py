"""start_method="spawn": real fresh Python processes, gloo on CPU.

Functions here are compiled into a namespace named ``__main__`` (as a notebook
cell's are), so cloudpickle must ship them by value, exactly as in a notebook;
plain pickle could not find them in a fresh process.
"""
from __future__ import annotations

import linecache
import os
import random
import sys
import tempfile
import textwrap
import threading

import pytest
import torch

from notebook_launch import GuardError, LaunchArgumentError, LaunchError, notebook_launcher
from notebook_launch.planning import preflight
from notebook_launch.notebook import cuda_tracking
from notebook_launch.engines import launcher_for
from notebook_launch.planning.options import default_start_method
from notebook_launch.planning.net import free_port

LAUNCH_TIMEOUT = 240  # seconds; spawned ranks import torch afresh, slow on a busy machine


def notebook_cell(source: str) -> dict:
    """Run ``source`` as IPython runs a cell: in a namespace called __main__, with the
    source kept only in linecache under a made-up file name."""
    source = textwrap.dedent(source)
    filename = f"/tmp/ipykernel_{os.getpid()}/{abs(hash(source))}.py"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace = {"__name__": "__main__"}
    exec(compile(source, filename, "exec"), namespace)
    return namespace


def spawn(fn, tmp_path, **kwargs):
    kwargs.setdefault("num_processes", 2)
    # A port of our own: other test runs on this shared machine launch on 29500 too, and two
    # launches that both found 29500 free can meet at one rendezvous store.
    kwargs.setdefault("use_port", str(free_port()))
    return notebook_launcher(fn, start_method="spawn", timeout=LAUNCH_TIMEOUT,
                             log_dir=str(tmp_path / "logs"), ui="text", **kwargs)


def process_alive(pid: int) -> bool:
    import psutil
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture
def private_tempdir(tmp_path, monkeypatch):
    """The spawn payload goes to tempfile's folder: give it one nobody else uses."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def test_notebook_defined_closure_lambda_and_instance_run_on_spawned_ranks(tmp_path, private_tempdir, capfd):
    cell = notebook_cell("""
        import os
        import sys
        import torch
        import torch.distributed as dist

        class Scaler:
            def __init__(self, factor):
                self.factor = factor
            def apply(self, x):
                return x * self.factor

        def make_train(scaler):
            offset = 100
            def train(transform, bias, *, label):
                dist.init_process_group("gloo")
                rank = dist.get_rank()
                total = torch.tensor([float(rank + 1)])
                dist.all_reduce(total)
                dist.destroy_process_group()
                print(f"stdout line from {rank}")
                print(f"stderr line from {rank}", file=sys.stderr)
                os.write(1, f"C-level write from {rank}\\n".encode())
                return {"rank": rank, "world": os.environ["WORLD_SIZE"], "pid": os.getpid(),
                        "scaled": scaler.apply(rank), "closure": offset + rank,
                        "lambda": transform(rank), "bias": bias.factor, "label": label,
                        "sum": total.item(), "tensor": torch.arange(3) * rank}
            return train
    """)
    scaler = cell["Scaler"](10)
    train = cell["make_train"](scaler)
    results = spawn(train, tmp_path, args=(lambda r: r * r + 1, cell["Scaler"](7)), kwargs={"label": "x"})

    assert [r["rank"] for r in results] == [0, 1]
    for rank, r in enumerate(results):
        assert r["world"] == "2"
        assert r["pid"] != os.getpid()
        assert r["scaled"] == 10 * rank
        assert r["closure"] == 100 + rank
        assert r["lambda"] == rank * rank + 1
        assert r["bias"] == 7 and r["label"] == "x"
        assert r["sum"] == 3.0
        assert torch.equal(r["tensor"], torch.arange(3) * rank)
    out, err = capfd.readouterr()
    assert "[rank 0] stdout line from 0" in out and "[rank 1] stdout line from 1" in out
    assert "[rank 1] C-level write from 1" in out
    assert "[rank 0] stderr line from 0" in err
    assert "on script (CPU, gloo, spawn), port " in out
    log = (tmp_path / "logs" / "rank1.log").read_text()
    assert "stdout line from 1" in log and "[stderr] stderr line from 1" in log
    assert list(private_tempdir.iterdir()) == [], "the pickled job must be removed after the run"


def test_spawned_ranks_restore_cwd_sys_path_torch_flags_and_random_states(tmp_path, private_tempdir,
                                                                          monkeypatch):
    modules = tmp_path / "my_modules"
    modules.mkdir()
    (modules / "helper_for_spawn_test.py").write_text("def triple(x):\n    return 3 * x\n")
    workdir = tmp_path / "workdir"
    workdir.mkdir()
    (workdir / "data.txt").write_text("relative file\n")
    monkeypatch.chdir(workdir)
    monkeypatch.syspath_prepend(str(modules))
    cell = notebook_cell("""
        import os, random, sys
        import torch
        import helper_for_spawn_test

        def train():
            with open("data.txt") as f:        # relative to the notebook's working directory
                text = f.read().strip()
            return {"cwd": os.getcwd(), "text": text, "sys_path": list(sys.path),
                    "helper": helper_for_spawn_test.triple(5),
                    "deterministic": torch.are_deterministic_algorithms_enabled(),
                    "precision": torch.get_float32_matmul_precision(),
                    "dtype": str(torch.get_default_dtype()),
                    "torch_rand": torch.rand(3), "random": random.random()}
    """)
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    old_precision = torch.get_float32_matmul_precision()
    torch.use_deterministic_algorithms(True)
    torch.set_float32_matmul_precision("medium")
    torch.set_default_dtype(torch.float64)
    torch.manual_seed(1234)
    random.seed(99)
    try:
        results = spawn(cell["train"], tmp_path)
        expected_torch = torch.rand(3)       # what a forked rank would draw next
        expected_random = random.random()
    finally:
        torch.set_default_dtype(torch.float32)
        torch.use_deterministic_algorithms(was_deterministic)
        torch.set_float32_matmul_precision(old_precision)
    for r in results:
        assert r["cwd"] == str(workdir)
        assert r["text"] == "relative file"
        assert r["helper"] == 15
        assert r["sys_path"][:len(sys.path)] == sys.path
        assert r["deterministic"] is True
        assert r["precision"] == "medium"
        assert r["dtype"] == "torch.float64"
        assert torch.equal(r["torch_rand"], expected_torch)
        assert r["random"] == expected_random


def test_failing_rank_stops_the_others_and_their_children(tmp_path, private_tempdir):
    pid_file = tmp_path / "grandchild.pid"
    cell = notebook_cell(f"""
        import os, subprocess, time

        def train():
            rank = int(os.environ["RANK"])
            if rank == 0:
                child = subprocess.Popen(["sleep", "600"])
                with open({str(pid_file)!r} + ".tmp", "w") as f:
                    f.write(str(child.pid))
                os.rename({str(pid_file)!r} + ".tmp", {str(pid_file)!r})
                time.sleep(600)
            while not os.path.exists({str(pid_file)!r}):
                time.sleep(0.05)
            print("rank 1 about to fail")
            raise ValueError("bad batch on rank 1")
    """)
    with pytest.raises(LaunchError) as info:
        spawn(cell["train"], tmp_path)
    err = info.value
    assert err.rank == 1 and err.kind == "exception"
    assert err.exc_type == "ValueError" and "bad batch on rank 1" in str(err)
    assert err.remote_traceback is not None
    assert 'raise ValueError("bad batch on rank 1")' in err.remote_traceback
    assert "rank 0: stopped by notebook_launch" in str(err)
    grandchild = int(pid_file.read_text())
    assert not process_alive(grandchild), "the rank's own subprocess must be stopped with it (process group)"
    assert "rank 1 about to fail" in (tmp_path / "logs" / "rank1.log").read_text()


def test_rank_killed_by_signal_is_reported(tmp_path, private_tempdir):
    cell = notebook_cell("""
        import os, signal, time

        def train():
            if os.environ["RANK"] == "1":
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(600)
    """)
    with pytest.raises(LaunchError) as info:
        spawn(cell["train"], tmp_path)
    assert info.value.rank == 1 and info.value.kind == "signal"
    assert "killed by SIGKILL" in str(info.value)


def test_job_that_cannot_be_loaded_in_a_fresh_process_says_what_to_do(tmp_path, private_tempdir,
                                                                      monkeypatch):
    modules = tmp_path / "only_in_notebook"
    modules.mkdir()
    (modules / "vanishing_module_for_spawn_test.py").write_text("def work():\n    return 1\n")
    monkeypatch.syspath_prepend(str(modules))
    import vanishing_module_for_spawn_test as vanishing
    monkeypatch.setitem(sys.modules, "vanishing_module_for_spawn_test", vanishing)  # dropped afterwards
    # Still imported in the notebook, but no longer importable from its files:
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(modules)])

    with pytest.raises(LaunchError) as info:
        spawn(vanishing.work, tmp_path)
    message = str(info.value)
    assert info.value.exc_type == "ModuleNotFoundError"
    assert "could not load the launched function" in message
    assert "'vanishing_module_for_spawn_test'" in message
    assert "define that code in a notebook cell" in message and "sys.path" in message


def test_unpicklable_argument_is_refused_before_any_rank_starts(tmp_path, private_tempdir):
    def train(lock):
        return 1

    with pytest.raises(LaunchArgumentError) as info:
        spawn(train, tmp_path, args=(threading.Lock(),))
    message = str(info.value)
    assert "args[0]" in message and "_thread.lock" in message
    assert "inside the launched function" in message
    assert list(private_tempdir.iterdir()) == []


def test_cuda_guard_stops_fork_but_lets_spawn_through(monkeypatch):
    # No GPU here: a stand-in says CUDA is initialized in the parent.
    monkeypatch.setattr(cuda_tracking, "is_cuda_initialized", lambda: True, raising=True)
    with pytest.raises(GuardError, match="start_method='spawn'"):
        preflight.check_cuda_not_initialized("fork", 0)
    preflight.check_cuda_not_initialized("spawn", 0)


@pytest.mark.parametrize("platform, expected", [("linux", "fork"), ("darwin", "spawn"), ("win32", "spawn")])
def test_default_start_method_uses_spawn_where_fork_is_unsafe(monkeypatch, platform, expected):
    monkeypatch.setattr(sys, "platform", platform)
    assert default_start_method() == expected


def test_get_backend_spawn():
    assert launcher_for("spawn").name == "spawn"


def start_notebook_process(tmp_path):
    """A separate 'notebook' process that launches 2 spawned ranks which sleep; returns
    (process, rank pids) once both ranks run."""
    import subprocess
    import time

    pids = tmp_path / "pids"
    pids.mkdir()
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent(f"""
        import os, sys, time
        from notebook_launch import notebook_launcher

        def train():
            open(os.path.join({str(pids)!r}, str(os.getpid())), "w").close()
            time.sleep(600)

        try:
            notebook_launcher(train, num_processes=2, start_method="spawn", ui="none",
                              log_dir={str(tmp_path / "logs")!r}, use_port="{free_port()}")
        except KeyboardInterrupt:
            ranks = [int(name) for name in os.listdir({str(pids)!r})]
            alive = [pid for pid in ranks if os.path.exists(f"/proc/{{pid}}")]
            print(f"parent got KeyboardInterrupt; ranks alive: {{alive}}", flush=True)
            sys.exit(130)
    """))
    parent = subprocess.Popen([sys.executable, str(script)], cwd=str(tmp_path),
                              stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + LAUNCH_TIMEOUT
    while len(list(pids.iterdir())) < 2 and time.monotonic() < deadline and parent.poll() is None:
        time.sleep(0.1)
    rank_pids = [int(p.name) for p in pids.iterdir()]
    if len(rank_pids) != 2:
        parent.kill()
        pytest.fail(f"both ranks should have started; parent exit status {parent.wait()}")
    return parent, rank_pids


def wait_until_gone(pids, seconds=60):
    import time
    deadline = time.monotonic() + seconds
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [p for p in pids if process_alive(p)]
        time.sleep(0.1)
    return alive


def test_spawned_ranks_die_with_the_notebook(tmp_path):
    """A kernel that dies (restart, OOM kill) must not leave ranks behind: PDEATHSIG."""
    import signal
    parent, rank_pids = start_notebook_process(tmp_path)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    assert wait_until_gone(rank_pids) == [], "spawned ranks outlived the notebook process"


def test_interrupting_the_notebook_stops_spawned_ranks(tmp_path):
    """Jupyter's interrupt is SIGINT to the kernel: the launch stops its ranks and re-raises."""
    import signal
    parent, rank_pids = start_notebook_process(tmp_path)
    parent.send_signal(signal.SIGINT)
    out, _ = parent.communicate(timeout=120)
    # Checked in the parent before it exits: PDEATHSIG cannot have done it for us.
    assert parent.returncode == 130 and "parent got KeyboardInterrupt; ranks alive: []" in out, out


def test_accelerate_inside_spawned_ranks_sees_the_whole_world(tmp_path, private_tempdir):
    cell = notebook_cell("""
        def train():
            from accelerate import Accelerator
            accelerator = Accelerator()
            import torch
            total = accelerator.reduce(torch.tensor([accelerator.process_index + 1.0]), "sum")
            return (accelerator.process_index, accelerator.num_processes,
                    str(accelerator.distributed_type), total.item())
    """)
    results = spawn(cell["train"], tmp_path)
    assert [r[:2] for r in results] == [(0, 2), (1, 2)]
    assert all(r[2] == "DistributedType.MULTI_CPU" and r[3] == 3.0 for r in results)


def test_without_pidfd_a_pipe_tells_when_a_rank_exits(tmp_path, private_tempdir, monkeypatch):
    """macOS has no os.pidfd_open: the backend falls back to a pipe only the rank holds."""
    monkeypatch.delattr(os, "pidfd_open")
    cell = notebook_cell("""
        import os
        def train():
            if os.environ["RANK"] == "1":
                raise RuntimeError("rank 1 fails after the pipe fallback")
            return "rank 0 value"
    """)
    with pytest.raises(LaunchError) as info:
        spawn(cell["train"], tmp_path)
    assert info.value.rank == 1 and "rank 1 fails after the pipe fallback" in str(info.value)
    assert info.value.results is not None
    assert info.value.results[0] in ("rank 0 value", None)  # rank 0 may be stopped first
    results = spawn(cell["train"], tmp_path, num_processes=1)
    assert results == ["rank 0 value"]
