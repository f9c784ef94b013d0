"""Persistent ranks (start_ranks): state across calls, the failure and interrupt semantics,
the restart after a dead or stuck rank, and no process left behind. Real forked ranks, gloo."""
import functools
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import psutil
import pytest
import torch
import torch.distributed as dist

from notebook_launch import LaunchArgumentError, LaunchError, start_ranks
from notebook_launch.planning.net import free_port   # not 29500: on a shared machine another may take it first

from helpers.waiting import ended, wait_for, wait_until_inside
from helpers.processes import children, running

pytestmark = pytest.mark.timeout(120)


# --- functions the ranks run (this module is importable: they travel by reference) ----------

# What the ranks keep as globals between calls, declared for the type checker only: no value, so
# a rank that has not set one still reads it as missing (read_global).
model: torch.nn.Linear
calls: int
rank0_was_interrupted: bool
interrupted: bool
kept: str

def build(size):
    global model, calls
    dist.init_process_group("gloo")
    model = torch.nn.Linear(size, size)
    calls = 1
    return dist.get_rank()


def step():
    global calls
    calls += 1
    total = torch.ones(1) * (dist.get_rank() + 1)
    dist.all_reduce(total)
    return {"shape": tuple(model.weight.shape), "sum": total.item(), "calls": calls,
            "initialized": dist.is_initialized(), "pid": os.getpid()}


def fail_on_rank_1_while_rank_0_waits_in_python(marker_dir):
    global rank0_was_interrupted
    marker = os.path.join(marker_dir, "rank0-waits")
    if dist.get_rank() == 1:
        while not os.path.exists(marker):   # rank 0 is in its loop by then
            time.sleep(0.01)
        raise ValueError("boom on rank 1")
    try:
        open(marker, "w").close()   # in the try: the interrupt may come as soon as the marker is there
        while True:
            time.sleep(0.01)
    except KeyboardInterrupt:
        rank0_was_interrupted = True
        raise


def fail_on_rank_1_while_rank_0_waits_in_a_barrier(rank_0_pid):
    if dist.get_rank() == 1:
        wait_until_inside(rank_0_pid, "barrier")   # rank 0's whereabouts record says it is in there
        raise ValueError("boom before the barrier")
    dist.barrier()


def die_on_rank_1():
    if dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(30)


def wait_for_interrupt(marker_dir):
    global interrupted
    try:
        open(os.path.join(marker_dir, f"running{os.environ['RANK']}"), "w").close()   # then interrupts come
        while True:
            time.sleep(0.01)
    except KeyboardInterrupt:
        interrupted = True
        raise


def ignore_interrupts(marker_dir):
    """Swallow every interrupt, counting each in the marker ``interruptedRANK`` (a byte each)."""
    rank = os.environ["RANK"]
    announced = False
    while True:
        try:
            if not announced:
                open(os.path.join(marker_dir, f"running{rank}"), "w").close()   # then interrupts come
                announced = True
            time.sleep(0.01)
        except KeyboardInterrupt:
            with open(os.path.join(marker_dir, f"interrupted{rank}"), "a") as counted:
                counted.write("x")


def read_global(name):
    return globals().get(name, "missing")


def print_lines(text):
    print(f"{text} from rank {os.environ['RANK']}")
    print("no newline at the end", end="")
    return True


def sleep_forever():
    while True:
        time.sleep(0.01)


# --- helpers ------------------------------------------------------------------------------

def interrupt_when_running(marker_dir, count, ranks=2):
    """SIGINT this process (what a kernel interrupt is) once every rank runs; ``count`` times,
    each once every rank got the one before (``ignore_interrupts`` counts them), so that two
    never land as one. Past the generous wait it sends anyway: the test then fails, not hangs."""
    def markers(name):
        return [os.path.join(marker_dir, f"{name}{r}") for r in range(ranks)]

    def every_rank_interrupted(times):
        return all(os.path.exists(p) and os.path.getsize(p) >= times for p in markers("interrupted"))

    def send():
        wait_for(lambda: all(os.path.exists(p) for p in markers("running")))
        for sent in range(1, count + 1):
            os.kill(os.getpid(), signal.SIGINT)
            if sent < count:
                wait_for(functools.partial(every_rank_interrupted, sent))
    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def our_children():
    return running(children())


@pytest.fixture
def ranks(log_dir):
    with start_ranks(2, ui="none", log_dir=log_dir, interrupt_grace=2.0, use_port=free_port()) as pool:
        yield pool
    assert our_children() == []


# --- tests --------------------------------------------------------------------------------

def test_state_and_process_group_live_across_calls(ranks, log_dir):
    assert ranks.run(build, args=(3,)) == [0, 1]
    pids = ranks.pids
    first = ranks.run(step)
    second = ranks.run(step)
    assert [r["shape"] for r in second] == [(3, 3), (3, 3)]
    assert [r["sum"] for r in first] == [3.0, 3.0]
    assert [r["calls"] for r in second] == [3, 3]      # the same namespace, three calls on
    assert all(r["initialized"] for r in second)      # nothing of ours destroyed the group
    assert [r["pid"] for r in second] == pids
    ranks.push(lr=1e-4, epochs=2)
    assert ranks.pull("lr") == [1e-4, 1e-4]
    assert ranks.pull("lr", "epochs") == [{"lr": 1e-4, "epochs": 2}, {"lr": 1e-4, "epochs": 2}]
    log = open(os.path.join(log_dir, "rank1.log")).read()
    assert "----- call 1: run(build) -----" in log and "----- call 5: pull lr -----" in log


def test_notebook_functions_run_in_the_ranks_namespace(ranks):
    """Functions of __main__ travel by value with the notebook's globals; what a rank assigned wins."""
    notebook = {"__name__": "__main__", "offset": 10, "weights": "notebook copy"}
    exec(textwrap.dedent("""
        def build():
            global weights
            weights = "rank copy"
        def use():
            return weights, offset
    """), notebook)
    ranks.run(notebook["build"])
    notebook["offset"] = 20                 # the notebook changes a value after the start
    assert ranks.run(notebook["use"]) == [("rank copy", 20), ("rank copy", 20)]


def test_an_exception_interrupts_the_other_ranks_and_keeps_them_alive(ranks, tmp_path):
    ranks.run(build, args=(2,))
    pids = ranks.pids
    with pytest.raises(LaunchError) as caught:
        ranks.run(fail_on_rank_1_while_rank_0_waits_in_python, args=(str(tmp_path),))
    message = str(caught.value)
    assert caught.value.rank == 1 and caught.value.exc_type == "ValueError"
    assert message.startswith("rank 1 failed: ValueError: boom on rank 1")
    assert "rank 0: interrupted after rank 1 failed (alive, state kept)" in message
    assert "still running, with their state" in message
    assert ranks.pids == pids
    assert ranks.run(read_global, args=("rank0_was_interrupted",)) == [True, "missing"]
    assert [r["calls"] for r in ranks.run(step)] == [2, 2]   # the state of build is still there


def test_a_rank_stuck_in_a_gloo_barrier_gets_the_ranks_restarted(ranks, capsys):
    """SIGINT does not bring a rank out of a gloo barrier: after the grace, every rank is
    stopped; the next call says so and runs on fresh ranks (state lost)."""
    ranks.run(build, args=(2,))
    old_pids = ranks.pids
    with pytest.raises(LaunchError) as caught:
        ranks.run(fail_on_rank_1_while_rank_0_waits_in_a_barrier, args=(old_pids[0],))
    assert caught.value.rank == 1 and caught.value.exc_type == "ValueError"   # it saw rank 0 in the barrier
    assert "rank 0 did not come back within 2 s of the interrupt" in str(caught.value)
    assert "state (models, variables, process group) is lost" in str(caught.value)
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
                   for pid in old_pids)
    capsys.readouterr()
    assert ranks.run(read_global, args=("calls",)) == ["missing", "missing"]
    notice = capsys.readouterr().out
    assert "the ranks were restarted because rank 0 did not come back" in notice
    assert "this call runs on fresh ranks" in notice
    assert set(ranks.pids).isdisjoint(old_pids) and ranks.restarts == 1


def test_a_dead_rank_fails_the_call_and_the_next_call_restarts(ranks, capsys):
    ranks.run(build, args=(2,))
    old_pids = ranks.pids
    with pytest.raises(LaunchError) as caught:
        ranks.run(die_on_rank_1)
    assert caught.value.kind == "signal" and caught.value.rank == 1
    assert "rank 1 died (killed by SIGKILL" in str(caught.value)
    assert "Every rank was stopped because rank 1 died" in str(caught.value)
    assert "The next call starts fresh ranks" in str(caught.value)
    capsys.readouterr()
    assert ranks.run(build, args=(4,)) == [0, 1]       # a fresh group on fresh ranks
    assert "the ranks were restarted because rank 1 died" in capsys.readouterr().out
    assert set(ranks.pids).isdisjoint(old_pids)
    assert [r["shape"] for r in ranks.run(step)] == [(4, 4), (4, 4)]


def test_a_rank_killed_between_calls_is_noticed_before_the_next_call(ranks, capsys):
    ranks.run(build, args=(2,))
    os.kill(ranks.pids[0], signal.SIGKILL)
    assert wait_for(lambda: ended(ranks.pids[0]))   # dead before the next call: it ended between calls
    capsys.readouterr()
    assert ranks.run(read_global, args=("calls",)) == ["missing", "missing"]
    assert "local rank 0 ended between calls (killed by SIGKILL" in capsys.readouterr().out


def test_the_notebooks_interrupt_raises_in_the_ranks_and_keeps_them(ranks, tmp_path):
    ranks.run(build, args=(2,))
    pids = ranks.pids
    interrupt_when_running(str(tmp_path), count=1)
    with pytest.raises(KeyboardInterrupt):
        ranks.run(wait_for_interrupt, args=(str(tmp_path),))
    assert ranks.pids == pids and ranks.alive
    assert ranks.run(read_global, args=("interrupted",)) == [True, True]
    assert [r["calls"] for r in ranks.run(step)] == [2, 2]


def test_a_second_interrupt_stops_ranks_that_do_not_come_back(log_dir, tmp_path, capsys):
    with start_ranks(2, ui="none", log_dir=log_dir, interrupt_grace=60, use_port=free_port()) as ranks:
        ranks.run(build, args=(2,))
        old_pids = ranks.pids
        interrupt_when_running(str(tmp_path), count=2)
        with pytest.raises(KeyboardInterrupt) as interrupted:
            ranks.run(ignore_interrupts, args=(str(tmp_path),))
        assert str(interrupted.value) == (   # not the 60 s grace; and the cell says the state is gone
            "notebook_launch: interrupted twice\nEvery rank was stopped because a second interrupt (or Stop) came "
            "while they were being interrupted. The next call starts fresh ranks; their state (models, variables, "
            "process group) is lost.")
        assert not ranks.alive
        capsys.readouterr()
        assert ranks.run(read_global, args=("calls",)) == ["missing", "missing"]
        assert "a second interrupt" in capsys.readouterr().out
        assert set(ranks.pids).isdisjoint(old_pids)
    assert our_children() == []


def test_a_timeout_interrupts_the_call_and_keeps_the_ranks(ranks):
    ranks.run(build, args=(2,))
    with pytest.raises(LaunchError) as caught:
        ranks.run(sleep_forever, timeout=1)
    assert caught.value.kind == "timeout"
    assert "interrupted after the timeout (alive, state kept)" in str(caught.value)
    assert [r["calls"] for r in ranks.run(step)] == [2, 2]


def test_each_calls_output_lands_in_its_own_log_section(ranks, log_dir):
    ranks.run(print_lines, args=("first",))
    ranks.run(print_lines, args=("second",))
    log = open(os.path.join(log_dir, "rank0.log")).read()
    first, second = log.split("----- call 2: run(print_lines) -----")
    assert "first from rank 0" in first and "no newline at the end" in first
    assert "second from rank 0" in second and "first" not in second


def test_close_and_the_death_of_the_notebook_leave_no_process(tmp_path):
    script = tmp_path / "notebook.py"
    script.write_text(textwrap.dedent("""
        import sys, time
        from notebook_launch import start_ranks
        ranks = start_ranks(2, ui="none")
        ranks.run(time.sleep, args=(0,))
        print("PIDS", *ranks.pids, flush=True)
        time.sleep(600)
    """))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    while line and not line.startswith("PIDS"):
        line = proc.stdout.readline()
    pids = [int(p) for p in line.split()[1:]]
    assert len(pids) == 2 and all(psutil.pid_exists(p) for p in pids)
    proc.kill()                                        # the kernel dies
    proc.wait()
    assert wait_for(lambda: not any(psutil.pid_exists(p) for p in pids))   # what the notebook started ends
    ranks = start_ranks(2, ui="none")
    ranks.run(time.sleep, args=(0,))
    assert len(our_children()) == 2
    ranks.close()
    ranks.close()                                      # idempotent
    assert our_children() == []
    with pytest.raises(LaunchArgumentError, match="closed"):
        ranks.run(time.sleep, args=(0,))


def test_bad_arguments_are_named_before_anything_starts(ranks):
    with pytest.raises(LaunchArgumentError, match="start_method must be 'fork', 'spawn' or None"):
        start_ranks(2, start_method="xla")
    with pytest.raises(LaunchArgumentError, match="interrupt_grace"):
        start_ranks(2, interrupt_grace=0)
    with pytest.raises(LaunchArgumentError, match="num_processes"):
        start_ranks(0)
    with pytest.raises(LaunchArgumentError, match="function must be callable"):
        ranks.run("build")
    with pytest.raises(LaunchArgumentError, match="variable names"):
        ranks.pull("not a name")
    with pytest.raises(LaunchArgumentError, match="cannot be sent to the ranks"):
        ranks.run(print, args=(threading.Lock(),))
    with pytest.raises(LaunchError, match="NameError: 'nothing_here' not defined"):
        ranks.pull("nothing_here")


def test_an_interrupt_counts_for_the_call_it_names_only():
    """A SIGINT that lands before a rank started the call still interrupts it (as the call
    starts); one meant for an earlier call is ignored."""
    from notebook_launch.channels.interrupt_slot import InterruptSlot
    from notebook_launch.rank.serve import Interruptible
    slot = InterruptSlot()
    interrupts = Interruptible(slot)
    slot.request(4)
    interrupts.start(5)                                # an interrupt of call 4: not this one
    interrupts.handler(signal.SIGINT, None)            # ... and late: ignored
    interrupts.calling = False
    slot.request(6)                                    # call 6 interrupted before it started
    with pytest.raises(KeyboardInterrupt):
        interrupts.start(6)
    interrupts.calling = True
    with pytest.raises(KeyboardInterrupt):
        interrupts.handler(signal.SIGINT, None)
    interrupts.calling = False
    interrupts.handler(signal.SIGINT, None)            # between calls: ignored
    slot.close()


def init_with_short_timeout():
    global kept
    import datetime
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=3))
    kept = "still here"


def fail_while_rank_0_waits_in_an_all_reduce(rank_0_pid):
    if dist.get_rank() == 1:
        wait_until_inside(rank_0_pid, "all_reduce")
        raise ValueError("boom before the all_reduce")
    dist.all_reduce(torch.ones(1))


def recreate_group_and_all_reduce(marker_dir):
    import datetime
    dist.destroy_process_group()
    # rank 0 serves the new group's store on the same port: a rank that got here first would reach
    # the old one, which rank 0 then closes (a broken pipe). Every rank destroys, then any creates.
    open(os.path.join(marker_dir, f"destroyed{os.environ['RANK']}"), "w").close()
    assert wait_for(lambda: all(os.path.exists(os.path.join(marker_dir, f"destroyed{r}")) for r in range(2)))
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=3))
    total = torch.ones(1)
    dist.all_reduce(total)
    return kept, total.item()


def test_a_group_timeout_shorter_than_the_grace_keeps_a_stuck_ranks_state(log_dir, tmp_path):
    """What the README recommends for collectives: the group's own timeout brings the waiting
    rank back within the grace, so nothing is restarted; the group is re-created in a call."""
    with start_ranks(2, ui="none", log_dir=log_dir, interrupt_grace=10, use_port=free_port()) as ranks:
        ranks.run(init_with_short_timeout)
        pids = ranks.pids
        with pytest.raises(LaunchError) as caught:
            ranks.run(fail_while_rank_0_waits_in_an_all_reduce, args=(pids[0],))
        assert caught.value.rank == 1 and caught.value.exc_type == "ValueError"   # rank 0 was in the all_reduce
        assert "still running, with their state" in str(caught.value)
        assert ranks.run(recreate_group_and_all_reduce, args=(str(tmp_path),)) == [("still here", 2.0)] * 2
        assert ranks.pids == pids and ranks.restarts == 0


def test_the_magics_name_bad_options_before_anything_starts():
    from notebook_launch.magics.ranks import ranks_magic
    with pytest.raises(LaunchArgumentError, match="%ranks start: unrecognized arguments: --bogus"):
        ranks_magic(None, "start -n 2 --bogus")
    with pytest.raises(LaunchArgumentError, match="-n/--num-processes must be a whole number"):
        ranks_magic(None, "start -n two")
    with pytest.raises(LaunchArgumentError, match="%ranks pull takes variable names"):
        ranks_magic(None, "pull")
    with pytest.raises(LaunchArgumentError, match="unknown command 'restart'"):
        ranks_magic(None, "restart")
    with pytest.raises(LaunchArgumentError, match="no ranks are running"):
        ranks_magic(None, "", "x = 1")
    with pytest.raises(LaunchArgumentError, match="%%launch: unrecognized arguments: --grace"):
        from notebook_launch.magics.launch import parse_launch_line
        parse_launch_line("-n 2 --grace 3")
