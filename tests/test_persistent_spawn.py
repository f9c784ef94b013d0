"""Persistent ranks started as fresh interpreters (``start_ranks(start_method="spawn")``,
``%ranks start --spawn``): the way out once the notebook initialized CUDA, where a fork is
refused. Real spawned processes and gloo; no GPU exists here, so CUDA's initialization is a
stand-in (``cuda_tracking.is_cuda_initialized`` patched to say True, as tests/test_spawn.py's
guard test does) and a poisoned fork is ``fake_cuda_build_standin``'s FAKE CUDA build."""
from __future__ import annotations

import os
import signal
import textwrap
import time

import psutil
import pytest
import torch
import torch.distributed as dist

from helpers.fake_cuda_build_standin import fake_gpus_tracked
from notebook_launch import GuardError, LaunchError, start_ranks
from notebook_launch.planning import preflight
from notebook_launch.notebook import cuda_tracking
from notebook_launch.engines.local import start_process
from notebook_launch.planning.net import free_port
from helpers.processes import children, is_start_process, running
from helpers.waiting import ended, wait_for

pytestmark = pytest.mark.timeout(300)
SPAWN_WAY_OUT = ("start_ranks(..., start_method='spawn')", "%ranks start --spawn")


weights: torch.Tensor   # set by build(), in the ranks (declared only)


def build(size):
    global weights
    dist.init_process_group("gloo")
    weights = torch.full((size,), float(dist.get_rank()))
    return dist.get_rank()


def reduce_weights():
    total = weights.clone()
    dist.all_reduce(total)
    return total.tolist()


def fail_on_rank_1():
    if dist.get_rank() == 1:
        raise ValueError("bad batch on rank 1")
    return "ok"


def sleep_long():
    time.sleep(600)


def our_children():
    return running(children())


@pytest.fixture
def cuda_initialized_standin(monkeypatch):
    """The notebook 'initialized CUDA' (a stand-in: no GPU here)."""
    monkeypatch.setattr(cuda_tracking, "is_cuda_initialized", lambda: True, raising=True)


def test_after_cuda_a_fork_is_refused_naming_spawn_and_spawned_ranks_keep_their_state(cuda_initialized_standin):
    with pytest.raises(GuardError) as refused:
        start_ranks(2, ui="none", start_method="fork")
    assert all(way in str(refused.value) for way in SPAWN_WAY_OUT), str(refused.value)
    assert our_children() == []

    with start_ranks(2, start_method="spawn", ui="none", use_port=free_port(), interrupt_grace=10) as ranks:
        assert ranks.run(build, args=(3,)) == [0, 1]
        pids = ranks.pids
        for pid in pids:   # forks of the warm start process (never of this one), adopted as our children
            assert is_start_process(psutil.Process(pid))
            assert psutil.Process(pid).ppid() == getattr(start_process.running(), "pid", None)
        assert ranks.run(reduce_weights) == [[1.0, 1.0, 1.0]] * 2          # the group and weights live on

        offset = 5
        assert ranks.run(lambda x: x + offset, args=(1,)) == [6, 6]   # a closure travels by value
        ranks.push(scale=torch.arange(3.0))
        assert ranks.pull("scale")[1].tolist() == [0.0, 1.0, 2.0]
        assert ranks.run_cell("import os\ndoubled = scale * int(os.environ['RANK'])\ndoubled.sum()",
                              "<cell>", {}) == [
            torch.tensor(0.0), torch.tensor(3.0)]
        assert ranks.run_cell("marked = 1\nmarked", "<cell>", {}, ranks=[1]) == [
            pytest.importorskip("notebook_launch.rank.namespace").NotRun, 1]

        with pytest.raises(LaunchError, match="rank 1 failed: ValueError: bad batch on rank 1") as failed:
            ranks.run(fail_on_rank_1)
        assert "still running, with their state" in str(failed.value)
        with pytest.raises(LaunchError, match="timed out|timeout"):
            ranks.run(sleep_long, timeout=3)    # interrupted through the slot shared with spawned ranks
        assert ranks.pids == pids and ranks.alive
        assert [d.tolist() for d in ranks.pull("doubled")] == [[0.0] * 3, [0.0, 1.0, 2.0]]
        assert ranks.run(reduce_weights) == [[1.0, 1.0, 1.0]] * 2
    assert our_children() == []


def test_a_poisoned_fork_names_spawned_persistent_ranks_as_the_way_out(monkeypatch):
    """A FAKE CUDA build with two FAKE GPUs, asked is_available(): a fork is refused, and the
    advice names the spawned persistent ranks; spawn passes the check (no rank is started:
    a fake GPU could not run one)."""
    with fake_gpus_tracked(monkeypatch):
        assert torch.cuda.is_available()
        with pytest.raises(GuardError, match="The CUDA runtime was already used") as refused:
            start_ranks(2, ui="none", start_method="fork")
        assert all(way in str(refused.value) for way in SPAWN_WAY_OUT), str(refused.value)
        assert "forks only" not in str(refused.value)
        assert our_children() == []
        preflight.check_cuda_not_initialized("spawn", 2)


def test_spawned_persistent_ranks_in_a_kernel_after_cuda_was_initialized(tmp_path):
    from helpers.nbutil import cell_text, make_notebook, run_notebook
    nb = make_notebook(
        "%load_ext notebook_launch\nfrom notebook_launch import cuda_tracking\n"
        "cuda_tracking.is_cuda_initialized = lambda: True   # a stand-in: the notebook 'initialized CUDA'",
        "from notebook_launch.planning.net import free_port\nfrom notebook_launch import start_ranks\n"
        "start_ranks(2, ui='text', start_method='fork')   # asked for fork: refused",
        "%ranks start -n 2 --spawn --ui text --port {free_port()}",
        "%%ranks\nimport torch, torch.distributed as dist\ndist.init_process_group('gloo')\n"
        "w = torch.ones(2) * dist.get_rank()\nimport os\nos.getpid()",
        "factor = 10   # a notebook value the next cell uses",
        "%%ranks\ntotal = w.clone(); dist.all_reduce(total)\n(total * factor).tolist()",
        "%ranks pull total",
        "def shifted():   # a notebook function: runs in the ranks' namespace, with their w\n"
        "    return (w + factor).tolist()\n"
        "from notebook_launch.magics.ranks import active\nactive().run(shifted)",
        "%ranks stop",
        "import psutil; [p.pid for p in psutil.Process().children(recursive=True) "
        "if p.status() != psutil.STATUS_ZOMBIE and 'engines.local.start_server' not in ' '.join(p.cmdline())]",
    )
    run_notebook(nb, cwd=str(tmp_path), allow_errors=True)
    cells = nb.cells
    refusal = [o for o in cells[1].outputs if o.output_type == "error"][0]
    assert refusal.ename == "GuardError" and all(way in refusal.evalue for way in SPAWN_WAY_OUT)
    assert "spawn, persistent" in cell_text(cells[2])
    assert not [o for o in cells[2].outputs if o.output_type == "error"]
    pids = cell_text(cells[3])
    assert "[rank 0] " in pids and "[rank 1] " in pids
    # both ranks print it alike: one line naming both, or a line each when they print a second apart
    printed = cell_text(cells[5])
    assert "[ranks 0-1] [10.0, 10.0]" in printed or (
        "[rank 0] [10.0, 10.0]" in printed and "[rank 1] [10.0, 10.0]" in printed), printed
    assert "tensor([1., 1.])" in cell_text(cells[6])
    assert "[[10.0, 10.0], [11.0, 11.0]]" in cell_text(cells[7])
    assert not [o for o in cells[8].outputs if o.output_type == "error"]
    assert cell_text(cells[9]).strip().endswith("[]")


def test_spawned_ranks_are_not_left_behind_when_the_interpreter_exits(tmp_path):
    """A script that starts spawned persistent ranks and exits without close(): none stay."""
    import subprocess
    import sys
    script = tmp_path / "leave.py"
    script.write_text(textwrap.dedent(f"""
        from notebook_launch import start_ranks
        ranks = start_ranks(2, start_method="spawn", ui="none", use_port={free_port()})
        ranks.run(print, args=("hello",))
        print("PIDS", *ranks.pids, flush=True)
        """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240,
                          cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr
    pids = [int(p) for p in done.stdout.split("PIDS", 1)[1].split()]
    assert wait_for(lambda: all(ended(p) for p in pids)), [p for p in pids if not ended(p)]


def test_a_spawned_rank_killed_between_calls_is_noticed_and_fresh_ranks_are_spawned(capfd):
    with start_ranks(2, start_method="spawn", ui="none", use_port=free_port()) as ranks:
        ranks.push(kept=1)
        first = ranks.pids
        os.kill(first[1], signal.SIGKILL)
        assert wait_for(lambda: ended(first[1]))   # the start process may reap it at once: no psutil.Process
        assert ranks.run(os.getpid) != first
        assert "the ranks were restarted because local rank 1 ended between calls" in capfd.readouterr().out
        assert all(ended(p) for p in first)
        with pytest.raises(LaunchError, match="'kept' not defined"):
            ranks.pull("kept")                         # fresh interpreters: the state is gone, as said
        for pid in ranks.pids:
            assert is_start_process(psutil.Process(pid))
            assert psutil.Process(pid).ppid() == getattr(start_process.running(), "pid", None)
    assert our_children() == []


def test_a_call_that_times_out_while_spawned_ranks_still_start_keeps_them(tmp_path, monkeypatch):
    """Spawned ranks take seconds to start (here 4 s more, through a sitecustomize the ranks'
    interpreters run first, then the call's frame imports this module); a first call that times
    out meanwhile is not 'stuck': the ranks take the interrupt as the call's code starts, come back
    after the 1 s grace has passed, and stay (no restart)."""
    (tmp_path / "sitecustomize.py").write_text("import time\ntime.sleep(4)\n")
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    with start_ranks(2, start_method="spawn", ui="none", use_port=free_port(), interrupt_grace=1) as ranks:
        with pytest.raises(LaunchError, match="timed out") as timed_out:
            ranks.run(sleep_long, timeout=1)
        assert "still running, with their state" in str(timed_out.value), str(timed_out.value)
        pids = ranks.pids
        assert ranks.alive and ranks.run(os.getpid) == pids
        assert ranks.restarts == 0
    assert our_children() == []
