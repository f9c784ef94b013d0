"""When a run hangs, the error says where every rank is (issue 20): real gloo ranks that hang the
ways distributed runs do, ended by ``timeout=``; the LaunchError's first line is the verdict
(who waits in which collective, who never came and where it is), the per-rank stacks follow.

The verdict itself (``diagnose.hang_verdict``) is tested without processes at the end.

The timeouts are generous: the verdict is about where the ranks are once they hang, so a rank
must have reached its hanging line before the timeout fires (gloo's start on a loaded machine).
"""
from __future__ import annotations

import inspect
import os
import threading
import time

import pytest

from helpers.watching import WatchingDisplay, WhereReports

from notebook_launch import LaunchError, notebook_launcher
from notebook_launch.planning.net import free_port
from notebook_launch.wire.plan import StartMethod
from notebook_launch.rank.reports import whereabouts
from notebook_launch.diagnose.hang_verdict import (Collective, Frame, RankWhereabouts, ThreadStack, detail,
                                                    verdict)

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

HERE = os.path.basename(__file__)
HANG = 600   # seconds a deliberately hanging rank sleeps (the timeout ends it long before)
# The timeouts below give forked ranks, which reach their hang within 1-3 s on the 2-core CI machine,
# about 4x that; spawned ranks import torch first and get more.


def line_of(function, text: str) -> int:
    """The line number of the first line of ``function`` containing ``text``."""
    lines, first = inspect.getsourcelines(function)
    for offset, line in enumerate(lines):
        if text in line:
            return first + offset
    raise AssertionError(f"{text!r} not in {function.__name__}")


def rank() -> int:
    return int(os.environ["RANK"])


def evaluate():
    time.sleep(HANG)


def skips_an_all_reduce():
    """Rank 1 skips the fourth all_reduce (an evaluation only it runs, say): the others wait in it."""
    dist.init_process_group("gloo")
    t = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(t)
    if rank() == 1:
        evaluate()
    dist.all_reduce(t)


def calls_in_a_different_order():
    dist.init_process_group("gloo")
    t = torch.ones(4)
    dist.all_reduce(t)
    if rank() == 0:
        dist.broadcast(t, src=0)
    else:
        dist.all_reduce(t)
    time.sleep(HANG)


def never_joins():
    if rank() != 2:
        dist.init_process_group("gloo")
    time.sleep(HANG)


def sleeps_on_rank_1():
    if rank() == 1:
        time.sleep(HANG)
    return "done"


def all_reduce_then_sleep():
    dist.init_process_group("gloo")
    dist.all_reduce(torch.ones(2, 3, dtype=torch.float64))
    if rank() == 0:
        time.sleep(HANG)
    dist.barrier()


def launch(function, n: int, log_dir: str, timeout: float, start_method: StartMethod = "fork") -> LaunchError:
    with pytest.raises(LaunchError) as info:
        notebook_launcher(function, num_processes=n, timeout=timeout, log_dir=log_dir, ui="text",
                          use_port=str(free_port()), start_method=start_method)
    assert info.value.kind == "timeout"
    return info.value


def first_line(error: LaunchError) -> str:
    return str(error).splitlines()[0]


@pytest.mark.parametrize("n", [2, 4])
def test_a_rank_that_skips_an_all_reduce_is_named_with_where_it_is(n, log_dir):
    error = launch(skips_an_all_reduce, n, log_dir, timeout=8 + 2 * n)
    waiting = ", ".join(str(r) for r in range(n) if r != 1)
    who = f"rank {waiting} waits" if n == 2 else f"ranks {waiting} wait"
    call = line_of(skips_an_all_reduce, "dist.all_reduce(t)\n") + 3   # the all_reduce after the loop
    sleep = line_of(evaluate, "time.sleep")
    assert first_line(error) == (
        f"notebook_launch: timed out after {8 + 2 * n} s: {who} in all_reduce #4 ({HERE}:{call}); "
        f"rank 1 never reached it: it is in evaluate() at {HERE}:{sleep} (time.sleep(HANG))"), str(error)
    text = str(error)
    assert "Where each rank was:" in text
    assert "waits in all_reduce #4" in text and "tensors (4,) float32" in text
    assert "in no collective; the last one it called: all_reduce #3" in text   # rank 1
    # the verdict and the whole stacks are in each rank's log
    assert error.log_dir is not None
    with open(os.path.join(error.log_dir, "rank1.log")) as f:
        log = f.read()
    assert f"notebook_launch: where the ranks were (at the timeout): {first_line(error).split(' s: ')[1]}\n" \
           f"rank 1:\n" in log
    assert f"evaluate() at {HERE}:{sleep}" in log


def test_ranks_that_call_collectives_in_a_different_order(log_dir):
    error = launch(calls_in_a_different_order, 3, log_dir, timeout=12)
    broadcast = line_of(calls_in_a_different_order, "dist.broadcast")
    all_reduce = line_of(calls_in_a_different_order, "else:") + 1
    assert first_line(error) == (
        f"notebook_launch: timed out after 12 s: rank 0 waits in broadcast #2 ({HERE}:{broadcast}) while "
        f"ranks 1, 2 wait in all_reduce #2 ({HERE}:{all_reduce}): the ranks call collectives in a different order"
    ), str(error)


def test_a_rank_that_never_calls_init_process_group(log_dir):
    error = launch(never_joins, 3, log_dir, timeout=12)
    init = line_of(never_joins, "init_process_group")
    sleep = line_of(never_joins, "time.sleep")
    assert first_line(error) == (
        f"notebook_launch: timed out after 12 s: ranks 0, 1 wait in init_process_group ({HERE}:{init}); "
        f"rank 2 never joined: it is in never_joins() at {HERE}:{sleep} (time.sleep(HANG))"), str(error)


def test_a_rank_asleep_in_c_in_a_run_without_torch_distributed(log_dir):
    error = launch(sleeps_on_rank_1, 3, log_dir, timeout=10)
    sleep = line_of(sleeps_on_rank_1, "time.sleep")
    assert first_line(error) == (
        f"notebook_launch: timed out after 10 s: "
        f"ranks 0, 2 ended (finished); rank 1 is in sleeps_on_rank_1() at {HERE}:{sleep} (time.sleep(HANG))"
    ), str(error)
    assert error.results is not None
    assert error.results[0] == "done" and error.results[1] is None


def test_a_rank_asleep_in_c_while_the_other_waits_in_a_barrier(log_dir):
    error = launch(all_reduce_then_sleep, 2, log_dir, timeout=10)
    sleep = line_of(all_reduce_then_sleep, "time.sleep")
    barrier = line_of(all_reduce_then_sleep, "dist.barrier")
    assert first_line(error) == (
        f"notebook_launch: timed out after 10 s: rank 1 waits in barrier #2 ({HERE}:{barrier}); "
        f"rank 0 never reached it: it is in all_reduce_then_sleep() at {HERE}:{sleep} (time.sleep(HANG))"), str(error)
    assert "the last one it called: all_reduce #1" in str(error)


def test_spawned_ranks_say_where_they_are_too(log_dir):
    error = launch(skips_an_all_reduce, 2, log_dir, timeout=40, start_method="spawn")
    sleep = line_of(evaluate, "time.sleep")
    assert first_line(error).startswith("notebook_launch: timed out after 40 s: rank 0 waits in all_reduce #4 (")
    assert first_line(error).endswith(f"rank 1 never reached it: it is in evaluate() at {HERE}:{sleep} "
                                      f"(time.sleep(HANG))")


# --- the verdict, without processes ---------------------------------------------------------

def cells(filename: str) -> str | None:
    return {"cell5": "Cell In[5]", "cell2": "Cell In[2]"}.get(filename)


def at(filename: str, line: int, function: str = "train") -> Frame:
    return Frame(filename, line, function)


def waiting(rank: int, op: str = "all_reduce", seq: int = 57, line: int = 12, group: str = "default group"):
    c = Collective(op, group, seq, "(4,) float32", at("cell5", line))
    return RankWhereabouts(rank, inside=c, main_thread=1,
                           threads=[ThreadStack(1, True, [at("/x/site-packages/torch/distributed/c10d.py", 9,
                                                              op), at("cell5", line)])])


def elsewhere(rank: int, line: int = 30, function: str = "evaluate", last_seq: int = 56):
    last = Collective("all_reduce", "default group", last_seq, "(4,) float32", at("cell5", 12))
    return RankWhereabouts(rank, last=last, main_thread=1,
                           threads=[ThreadStack(1, True, [at("cell5", line, function), at("cell5", 40, "train")]),
                                    ThreadStack(2, False, [at("/usr/lib/python3.11/threading.py", 320, "wait")])])


def test_verdict_names_the_rank_that_never_reached_the_collective():
    ranks = [waiting(0), elsewhere(1), waiting(2), waiting(3)]
    assert verdict(ranks, cells) == ("ranks 0, 2, 3 wait in all_reduce #57 (Cell In[5], line 12); "
                                     "rank 1 never reached it: it is in evaluate() at Cell In[5], line 30")


def test_verdict_names_a_different_order():
    ranks = [waiting(0, "broadcast", 9, line=7), waiting(1, "all_reduce", 9)]
    assert verdict(ranks, cells) == ("rank 0 waits in broadcast #9 (Cell In[5], line 7) while rank 1 waits in "
                                     "all_reduce #9 (Cell In[5], line 12): the ranks call collectives in a "
                                     "different order")


def test_verdict_names_the_rank_that_never_joined():
    init = Collective("init_process_group", "default group", 0, "", at("cell2", 3, "main"))
    ranks = [RankWhereabouts(r, inside=init) for r in range(3)] + [elsewhere(3, line=4, function="load")]
    assert verdict(ranks, cells) == ("ranks 0, 1, 2 wait in init_process_group (Cell In[2], line 3); "
                                     "rank 3 never joined: it is in load() at Cell In[5], line 4")


def test_verdict_when_every_rank_is_in_the_same_collective():
    assert verdict([waiting(0), waiting(1)], cells).startswith(
        "every rank waits in all_reduce #57 (Cell In[5], line 12): all of them reached it")


def test_verdict_when_ranks_wait_at_different_numbers():
    ranks = [waiting(0, seq=58), waiting(1, seq=57), waiting(2, seq=58)]
    assert verdict(ranks, cells) == ("ranks 0, 2 wait in all_reduce #58 (Cell In[5], line 12); "
                                     "rank 1 waits in all_reduce #57 (Cell In[5], line 12) instead")


def test_verdict_when_no_rank_is_in_a_collective_groups_ranks_by_place():
    ranks = [elsewhere(0), elsewhere(1), elsewhere(2, line=44, function="save"),
             RankWhereabouts(3, note="ended (finished)")]
    assert verdict(ranks, cells) == (
        "no rank waits in a torch.distributed collective: ranks 0, 1 are in evaluate() at Cell In[5], line 30; "
        "rank 2 is in save() at Cell In[5], line 44; rank 3 ended (finished)")


def test_verdict_skips_library_frames_to_the_users_line():
    stuck = RankWhereabouts(1, main_thread=1, threads=[ThreadStack(1, True, [
        at("/usr/lib/python3.11/threading.py", 320, "wait"),
        at("/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py", 1100, "_next_data"),
        at("cell5", 22, "train")])])
    assert verdict([waiting(0), stuck], cells).endswith("rank 1 never reached it: it is in train() at Cell In[5], "
                                                        "line 22")


def test_detail_shows_each_rank_collective_and_threads_innermost_last():
    text = detail([waiting(0), elsewhere(1)], cells)
    assert text.splitlines()[:5] == [
        "rank 0:",
        "  waits in all_reduce #57 (Cell In[5], line 12), tensors (4,) float32",
        "  main thread (most recent call last):",
        "    train() at Cell In[5], line 12",
        "    all_reduce() at c10d.py:9",
    ]
    assert "  in no collective; the last one it called: all_reduce #56 (Cell In[5], line 12)" in text
    assert "  thread 0x2 (most recent call last):" in text


def test_the_dump_signal_is_not_one_users_or_schedulers_use():
    import signal
    assert whereabouts.DUMP_SIGNAL not in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT, signal.SIGTERM)
    assert signal.SIGRTMIN <= whereabouts.DUMP_SIGNAL <= signal.SIGRTMAX


def test_collectives_are_recorded_when_torch_is_imported_only_after_the_rank_started():
    """A spawned rank whose function imports torch itself: what makes a group is wrapped on import,
    the collectives once the first default group comes into being (before, none can run).
    A fresh Python loads the module from its file, under empty parent packages (the package's own
    __init__ imports bring torch), so only whereabouts and what it imports (fork_locks) run."""
    import subprocess
    import sys
    package = os.path.dirname(os.path.dirname(os.path.dirname(whereabouts.__file__)))
    parents = [("notebook_launch", package), ("notebook_launch.rank", package + "/rank"),
               ("notebook_launch.rank.reports", package + "/rank/reports")]
    code = (
        "import sys, types, importlib.util\n"
        f"for name, path in {parents!r}:\n"
        "    sys.modules[name] = parent = types.ModuleType(name); parent.__path__ = [path]\n"
        "spec = importlib.util.spec_from_file_location(\n"
        f"    'notebook_launch.rank.reports.whereabouts', {whereabouts.__file__!r})\n"
        "wb = importlib.util.module_from_spec(spec); spec.loader.exec_module(wb)\n"
        "assert 'torch' not in sys.modules\n"
        "wb.install(types.SimpleNamespace(global_rank=0, env={}))\n"
        "import torch.distributed as dist\n"
        "wrapped = lambda f: getattr(f, '_notebook_launch_wrapped', False)\n"
        "print(wrapped(dist.init_process_group), wrapped(dist.all_reduce))\n"
        "dist.init_process_group('gloo', store=dist.HashStore(), rank=0, world_size=1)\n"
        "print(wrapped(dist.all_reduce), wrapped(dist.distributed_c10d.barrier))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "False", "True", "True"]


# --- in a real kernel: frames named as cells -------------------------------------------------

HANGING_CELL = """\
def evaluate():
    time.sleep(600)

def train():
    dist.init_process_group("gloo")
    t = torch.ones(4)
    dist.all_reduce(t)
    if os.environ["RANK"] == "1":
        evaluate()
    dist.all_reduce(t)
"""


@pytest.fixture(scope="module")
def hung_in_a_kernel():
    pytest.importorskip("nbclient")
    from helpers.nbutil import make_notebook, run_notebook
    return run_notebook(make_notebook(
        "import os, time, torch, torch.distributed as dist\nfrom notebook_launch import notebook_launcher",
        HANGING_CELL,
        "notebook_launcher(train, num_processes=2, ui='text', timeout=20)",
        "notebook_launcher(train, num_processes=2, ui='text', timeout=40, start_method='spawn')",
    ), allow_errors=True)


@pytest.mark.parametrize("index", [2, 3], ids=["fork", "spawn"])
def test_in_a_kernel_the_verdict_names_cells(hung_in_a_kernel, index):
    import re
    errors = [out for out in hung_in_a_kernel.cells[index].outputs if out.output_type == "error"]
    assert len(errors) == 1 and errors[0].ename == "LaunchError"
    text = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(errors[0].traceback))
    timeout = 20 if index == 2 else 40
    assert (f"notebook_launch: timed out after {timeout} s: rank 0 waits in all_reduce #2 (Cell In[2], line 10); "
            f"rank 1 never reached it: it is in evaluate() at Cell In[2], line 2 (time.sleep(600))") in text, text
    assert "    evaluate() at Cell In[2], line 2" in text and "      time.sleep(600)" in text, text


# --- stall detection --------------------------------------------------------------------------

def test_stall_watch_counts_cpu_time_as_a_sign_of_progress():
    from notebook_launch.diagnose.stall import StallWatch
    cpu = {1: 0.0, 2: 0.0}
    watch = StallWatch(10, now=0.0, cpu=lambda pid: cpu[pid], waited=lambda pid: 0.0)
    assert watch.check(0, 1, 1.0) is None and watch.check(1, 2, 1.0) is None
    for second in range(2, 30):
        cpu[1] += 0.9          # rank 0 computes silently; rank 1 waits
        stalled_0, stalled_1 = watch.check(0, 1, float(second)), watch.check(1, 2, float(second))
        assert stalled_0 is None
        assert (stalled_1 is None) == (second < 10)
    assert stalled_1 == 0.0    # stalled since the start: it never showed a sign
    watch.saw(1, 30.0)         # an output line: no longer stalled
    assert watch.check(1, 2, 30.5) is None


def test_stall_watch_reads_nothing_in_the_runs_first_second():
    """A launch that ends within its first SAMPLE_EVERY (every short one) costs no /proc read: a
    first launch in a fresh process spent a quarter of its time in them. The first read after it
    is the baseline; the second judges the window since."""
    from notebook_launch.diagnose.stall import SAMPLE_EVERY, StallWatch
    reads = []

    def cpu(pid):
        reads.append(pid)
        return 0.9 * len(reads)

    watch = StallWatch(10, now=100.0, cpu=cpu, waited=lambda pid: 0.0)
    for now in (100.0, 100.2, 100.0 + SAMPLE_EVERY / 2, 100.0 + SAMPLE_EVERY * 0.99):
        assert watch.quiet_since(0, 7, now) == 100.0
    assert reads == []
    assert watch.quiet_since(0, 7, 100.0 + SAMPLE_EVERY) == 100.0 and reads == [7]   # the baseline
    assert watch.quiet_since(0, 7, 100.0 + 2 * SAMPLE_EVERY) == 100.0 + 2 * SAMPLE_EVERY   # it worked since


def test_a_run_is_stalled_only_when_no_rank_works_and_no_stack_moves():
    """check_all: a rank waiting while another computes (or writes a checkpoint) is not stalled;
    when none moves, two stack samples STACK_GAP apart confirm it, and a stack that changed in
    between starts the watch over. CPU time and stacks are given here (the real ones are read in
    the process tests above and below, and in test_stall_signs.py)."""
    from notebook_launch.diagnose.stall import STACK_GAP, StallWatch
    cpu, stacks = {1: 0.0, 2: 0.0}, {0: "a", 1: "b"}
    sampled = []

    def sample(pids):
        sampled.append(sorted(pids))
        return {local: stacks[local] for local in pids}

    watch = StallWatch(10, now=0.0, cpu=lambda pid: cpu[pid], stack=sample, waited=lambda pid: 0.0)
    live = [(0, 1), (1, 2)]
    for second in range(1, 29):
        cpu[1] += 0.9 if second < 12 else 0.0    # rank 0 computes for 12 s,
        cpu[1] += 0.2 if 12 <= second < 20 else 0.0   # then writes a checkpoint (system time) until second 19
        assert watch.check_all(live, float(second)) == {0: None, 1: None}
    assert not sampled
    assert watch.check_all(live, 29.0) == {0: None, 1: None}   # every rank quiet for 10 s: a first sample
    assert sampled == [[0, 1]]
    stacks[1] = "c"              # rank 1's stack moved between the samples: not stalled, its watch starts over
    assert watch.check_all(live, 29.0 + STACK_GAP) == {0: None, 1: None} and len(sampled) == 2
    moved = 29.0 + STACK_GAP
    assert watch.check_all(live, moved + 9) == {0: None, 1: None} and len(sampled) == 2
    assert watch.check_all(live, moved + 10) == {0: None, 1: None} and len(sampled) == 3
    assert watch.check_all(live, moved + 10 + STACK_GAP) == {0: 19.0, 1: moved}   # same stacks: stalled
    assert len(sampled) == 4
    assert watch.check_all(live, moved + 60) == {0: 19.0, 1: moved} and len(sampled) == 4   # no more samples
    watch.saw(0, moved + 61)     # a line: the run moves again
    assert watch.check_all(live, moved + 61) == {0: None, 1: None}


def computes_silently_while_the_other_waits():
    """Rank 0 computes for a while without a word (a long first epoch); rank 1 waits for it in a
    barrier, burning nothing. The run works: nobody may be called stalled."""
    dist.init_process_group("gloo")
    if rank() == 0:
        spent = time.process_time() + 8
        total = 0
        while time.process_time() < spent:   # 8 s of CPU, however loaded the machine
            total += sum(range(1000))
    dist.barrier()
    return rank()


def test_a_long_silent_computation_is_not_called_stalled(log_dir):
    marked: list[object] = []   # every stall mark and where-report the panel was shown
    reports = WhereReports()

    def watch(state):
        marked.extend((rs.local_rank, rs.stalled_since) for rs in state.ranks if rs.stalled_since is not None)
        if reports.new(state) is not None:
            marked.append(state.where_report)

    assert notebook_launcher(computes_silently_while_the_other_waits, num_processes=2, stall_after=2,
                             log_dir=log_dir, ui=WatchingDisplay(on_refresh=watch), use_port=str(free_port()),
                             timeout=120) == [0, 1]
    assert marked == []


def test_a_run_whose_ranks_all_wait_is_stalled_and_a_stop_says_where(log_dir):
    """Every rank waits (rank 1 skipped an all_reduce): the run is marked stalled, the state gets
    the verdict and the stacks (the panel draws them), the logs get them too; Stop then ends it
    with a LaunchError that starts with the verdict."""
    reports = []
    shown = WhereReports()

    def stop_when_stalled(state):   # as a person would press Stop on seeing the report
        text = shown.new(state)
        if text is not None:
            reports.append((text, [rs.stalled_since is not None for rs in state.ranks]))
            state.stop_requested = True

    with pytest.raises(LaunchError) as info:
        notebook_launcher(skips_an_all_reduce, num_processes=2, stall_after=2, log_dir=log_dir,
                          ui=WatchingDisplay(on_refresh=stop_when_stalled), use_port=str(free_port()), timeout=120)
    reduce = line_of(skips_an_all_reduce, "dist.all_reduce(t)\n") + 3   # the all_reduce after the loop
    sleep = line_of(evaluate, "time.sleep(HANG)")
    verdict = (f"rank 0 waits in all_reduce #4 ({HERE}:{reduce}); rank 1 never reached it: it is in evaluate() "
               f"at {HERE}:{sleep} (time.sleep(HANG))")
    text, marks = reports[0]
    assert marks == [True, True]
    assert text.startswith(f"stalled: no rank showed progress for 2 s; {verdict}\n\nrank 0:\n  stalled for "), text
    error = str(info.value)
    assert info.value.kind == "stopped"
    assert error.startswith(f"notebook_launch: stopped with the Stop button after the run stalled: {verdict}\n")
    assert "Where each rank was:\nrank 0:\n  stalled for" in error
    logs = [open(os.path.join(log_dir, f"rank{r}.log")).read() for r in (0, 1)]
    for log in logs:
        assert f"where the ranks were (stalled: no rank showed progress for 2 s): {verdict}" in log
    assert "waits in all_reduce #4" in logs[0] and f"evaluate() at {HERE}:{sleep}" in logs[1]


def waits_for_a_file(flag: str):
    print("waiting", flush=True)
    while not os.path.exists(flag):
        time.sleep(0.05)
    return rank()


def test_where_are_they_answers_the_button_and_stops_nothing(log_dir, tmp_path):
    """The panel's button sets ``where_requested`` (here: the display, once both ranks wait); the
    supervisor answers in ``where_report`` and the run goes on (the answer lets the ranks finish)."""
    flag = str(tmp_path / "go")
    answers: list[tuple[str, list[str], bool]] = []   # (the report, each rank's status, still requested)
    shown = WhereReports()

    def ask_when_both_wait(state, local_rank, stream, text):
        waiting = {rs.rank for rs in state.ranks if any(t == "waiting" for _, t in rs.lines)}
        if waiting == {0, 1} and not answers:
            state.where_requested = True

    def answered(state):
        text = shown.new(state)
        if text is not None:
            answers.append((text, [str(rs.status) for rs in state.ranks], state.where_requested))
            open(flag, "w").close()

    assert notebook_launcher(waits_for_a_file, (flag,), num_processes=2, log_dir=log_dir,
                             ui=WatchingDisplay(on_line=ask_when_both_wait, on_refresh=answered),
                             use_port=str(free_port()), timeout=120) == [0, 1]
    assert len(answers) == 1
    text, statuses, still_requested = answers[0]
    verdict = text.split("\n", 1)[0]   # both ranks in the wait loop: one place, or two lines of it
    assert verdict.startswith(f"ranks 0, 1 are in waits_for_a_file() at {HERE}:") or (
        verdict.startswith(f"rank 0 is in waits_for_a_file() at {HERE}:")
        and f"; rank 1 is in waits_for_a_file() at {HERE}:" in verdict), text
    assert "\n\nrank 0:\n  main thread (most recent call last):\n    waits_for_a_file() at" in text
    assert statuses == ["running", "running"] and not still_requested


def test_stall_after_has_one_default_everywhere():
    """notebook_launcher, start_ranks and the magics share DEFAULT_STALL_AFTER; a call on
    persistent ranks takes the pool's (None); the magics take seconds or none (not watched)."""
    from notebook_launch import start_ranks
    from notebook_launch.magics.launch import parse_launch_line
    from notebook_launch.persistent.pool import Ranks
    from notebook_launch.diagnose.stall import DEFAULT_STALL_AFTER
    assert DEFAULT_STALL_AFTER == 300.0
    for function in (notebook_launcher, start_ranks):
        assert inspect.signature(inspect.unwrap(function)).parameters["stall_after"].default == DEFAULT_STALL_AFTER
    for method in (Ranks.run, Ranks.run_cell):
        assert inspect.signature(inspect.unwrap(method)).parameters["stall_after"].default is None
    assert "stall_after" not in parse_launch_line("-n 2")
    assert parse_launch_line("-n 2 --stall-after 30")["stall_after"] == 30.0
    assert parse_launch_line("-n 2 --stall-after none")["stall_after"] is None
    assert parse_launch_line("--lines-per-second all")["lines_per_second"] == "all"


def test_stall_after_must_be_seconds():
    from notebook_launch.errors import LaunchArgumentError
    with pytest.raises(LaunchArgumentError, match="stall_after must be a number of seconds > 0"):
        notebook_launcher(sleeps_on_rank_1, num_processes=2, stall_after=-1)


def say_when_there(function, text: str, inside_torch: bool) -> None:
    """Print "hanging now" once this (main) thread is at ``function``'s line holding ``text``, and,
    with ``inside_torch``, inside torch's code under it (then our record says so): a watcher
    thread looks at the main thread's frames, so the line comes only once the rank hangs there."""
    import sys
    import threading
    main, line = threading.get_ident(), line_of(function, text)

    def watch():
        while True:
            innermost = sys._current_frames().get(main)
            user = innermost
            while user is not None and user.f_code is not function.__code__:
                user = user.f_back
            if innermost is not None and user is not None and user.f_lineno == line and \
                    ("/torch/" in innermost.f_code.co_filename) == inside_torch:
                print("hanging now", flush=True)
                return
            time.sleep(0.01)

    threading.Thread(target=watch, daemon=True).start()


def hangs_after_saying_so():
    dist.init_process_group("gloo")
    if rank() == 0:
        say_when_there(hangs_after_saying_so, "dist.barrier()\n", inside_torch=True)
        dist.barrier()
    say_when_there(hangs_after_saying_so, "time.sleep(HANG)\n", inside_torch=False)
    time.sleep(HANG)


def test_the_stop_button_says_where_the_ranks_were(log_dir):
    """Stop pressed on a hung run (the button sets ``stop_requested``; here the display does, as
    soon as both ranks said they hang, see ``say_when_there``): the KeyboardInterrupt says where
    they were."""

    def clicked_when_both_hang(state, local_rank, stream, text):
        hanging = {rs.rank for rs in state.ranks if any(t == "hanging now" for _, t in rs.lines)}
        state.stop_requested = state.stop_requested or hanging == {0, 1}

    with pytest.raises(KeyboardInterrupt) as info:
        notebook_launcher(hangs_after_saying_so, num_processes=2, log_dir=log_dir,
                          ui=WatchingDisplay(on_line=clicked_when_both_hang), use_port=str(free_port()), timeout=60)
    barrier = line_of(hangs_after_saying_so, "dist.barrier()\n")
    sleep = line_of(hangs_after_saying_so, "time.sleep(HANG)\n")
    assert str(info.value) == (
        f"notebook_launch: run stopped with the Stop button; where the ranks were: rank 0 waits in barrier #1 "
        f"({HERE}:{barrier}); rank 1 never reached it: it is in hangs_after_saying_so() at {HERE}:{sleep} "
        f"(time.sleep(HANG))")


def switches_recording_off_and_on():
    from notebook_launch.rank.reports import whereabouts as w
    dist.init_process_group("gloo")   # the collectives are wrapped once a group exists
    wrapped = getattr(dist.all_reduce, "_notebook_launch_wrapped", False)
    w.set_recording(dist, False)
    original = dist.all_reduce is dist.distributed_c10d.all_reduce and \
        not getattr(dist.all_reduce, "_notebook_launch_wrapped", False)
    w.set_recording(dist, True)
    again = getattr(dist.all_reduce, "_notebook_launch_wrapped", False)
    dist.destroy_process_group()
    return wrapped, original, again


def test_the_bookkeeping_can_be_swapped_out_and_left_out(log_dir, monkeypatch):
    """set_recording (the benchmark's switch) puts torch's own collectives back and the wrappers
    again; NOTEBOOK_LAUNCH_WHEREABOUTS=0 leaves the bookkeeping out of the ranks: a hang's timeout
    then says only which ranks were running."""
    assert notebook_launcher(switches_recording_off_and_on, num_processes=1, log_dir=log_dir, ui="none",
                             use_port=str(free_port())) == [(True, True, True)]
    monkeypatch.setenv("NOTEBOOK_LAUNCH_WHEREABOUTS", "0")
    assert notebook_launcher(switches_recording_off_and_on, num_processes=1, log_dir=log_dir, ui="none",
                             use_port=str(free_port()))[0][0] is False
    error = launch(sleeps_on_rank_1, 2, log_dir, timeout=10)
    assert first_line(error) == "notebook_launch: timed out after 10 s; ranks still running: 1"


def test_with_the_bookkeeping_left_out_no_rank_is_said_not_to_have_started(log_dir, monkeypatch):
    """NOTEBOOK_LAUNCH_WHEREABOUTS=0 and rank 0 waits in all_reduce while rank 1 is in its own code:
    the answer used to say "ranks 0, 1 had not started the launched function yet"; it says the
    record was left out and how to have it, and nothing about their not having started."""
    monkeypatch.setenv("NOTEBOOK_LAUNCH_WHEREABOUTS", "0")
    error = launch(skips_an_all_reduce, 2, log_dir, timeout=12)
    text = str(error)
    assert "had not started" not in text, text
    assert ("no rank could say where it is: ranks 0, 1 kept no whereabouts record "
            "(NOTEBOOK_LAUNCH_WHEREABOUTS=0 leaves that bookkeeping out of the ranks; unset it to see where "
            "ranks wait)") in text, text


def waits_silently_on_its_fifo(folder):
    """Blocks in open() of its FIFO (no CPU, no I/O, the same stack) until the notebook opens it
    for writing: a stall that clears, without a timed sleep."""
    with open(os.path.join(folder, f"fifo{rank()}")) as f:
        f.read()
    return rank()


def test_a_stall_that_cleared_leaves_no_verdict_in_the_panel_or_the_final_picture(log_dir, tmp_path, capsys):
    """Before, "stalled: ... never reached it" stayed in the state (the panel) and in the final
    picture of a run that went on and ended done."""
    for r in (0, 1):
        os.mkfifo(tmp_path / f"fifo{r}")
    reports, states = [], []

    def release():
        for r in (0, 1):
            with open(tmp_path / f"fifo{r}", "w"):   # the rank is in its open(): this returns at once
                pass

    shown = WhereReports()

    def released_when_stalled(state):
        text = shown.new(state)
        if text is not None:
            reports.append(text)
            states.append(state)
            if text.startswith("stalled"):
                threading.Thread(target=release, daemon=True).start()

    assert notebook_launcher(waits_silently_on_its_fifo, args=(str(tmp_path),), num_processes=2, stall_after=2,
                             log_dir=log_dir, ui=WatchingDisplay(on_refresh=released_when_stalled),
                             timeout=120) == [0, 1]
    assert reports and reports[0].startswith("stalled: no rank showed progress for 2 s; "), reports
    state = states[0]
    assert state.status == "done" and state.where_report is None, state.where_report
    final = capsys.readouterr().out.rsplit("notebook_launch run ", 1)[1]   # the final picture
    assert ", done, " in final.splitlines()[0], final
    assert "stalled" not in final and "where are they" not in final, final


def test_detail_leaves_out_our_threads_and_frames_and_says_how_many():
    """What the user sees (issue 35): the progress sender thread and our frames around and inside
    the user's function (a persistent call's serve loop and namespace, whereabouts' wrapper) are
    left out, counted; the logs' detail (``whole``) keeps them."""
    import notebook_launch
    ours = os.path.dirname(notebook_launch.__file__)
    stdlib = "/opt/py/lib/python3.99"   # Python's own files, by their place (not read: no source lines)
    main = ThreadStack(1, True, [
        at(os.path.join(ours, "rank", "reports", "whereabouts.py"), 80, "wrapped"),
        at("cell5", 12, "train"),
        at(os.path.join(ours, "rank", "namespace.py"), 75, "run_cell"),
        at(os.path.join(ours, "rank", "serve.py"), 98, "interruptible"),
        at(os.path.join(ours, "rank", "runner.py"), 200, "call_and_report"),
        at(os.path.join(ours, "rank", "serve.py"), 60, "serve_calls")])
    sender = ThreadStack(2, False, [at(os.path.join(stdlib, "threading.py"), 320, "wait"),
                                    at(os.path.join(ours, "rank", "reports", "progress.py"), 140, "_run"),
                                    at(os.path.join(stdlib, "threading.py"), 1010, "run")])
    users = ThreadStack(3, False, [at(os.path.join(stdlib, "queue.py"), 171, "get"), at("cell2", 6, "prefetch")])
    rank = RankWhereabouts(0, main_thread=1, threads=[main, sender, users])
    shown = detail([rank], cells)
    assert shown.splitlines() == [
        "rank 0:",
        "  main thread (most recent call last):",
        "    train() at Cell In[5], line 12",
        "    (5 frames of notebook_launch hidden)",
        "  thread 0x3 (most recent call last):",
        "    prefetch() at Cell In[2], line 6",
        "    get() at queue.py:171",
        "  (1 thread of notebook_launch hidden)",
    ], shown
    whole = detail([rank], cells, whole=True)
    assert "_run() at progress.py:140" in whole and "interruptible() at serve.py:98" in whole
    assert verdict([rank], cells) == "rank 0 is in train() at Cell In[5], line 12"


def test_what_answering_where_they_are_costs_the_ranks_is_no_sign_of_progress():
    """Issue 47: a stalled run flipped back to "running" about once in three runs, then was marked
    stalled again with younger ages than its report said: each stack sample, and each answer to
    "Where are they?", costs the asked ranks CPU time (their where-thread walks every stack), which
    on a loaded machine crossed BUSY_SHARE and read as work. The time spent answering is not judged;
    work after it still is."""
    from notebook_launch.diagnose.stall import STACK_GAP, StallWatch
    cpu = {1: 0.0, 2: 0.0}

    def sample(pids):   # answering costs each rank 0.3 s of CPU: well over BUSY_SHARE of a second
        for pid in pids.values():
            cpu[pid] += 0.3
        return {local: "waits" for local in pids}

    watch = StallWatch(5, now=0.0, cpu=lambda pid: cpu[pid], stack=sample, waited=lambda pid: 0.0)
    live = [(0, 1), (1, 2)]
    found: dict[int, float | None] = {}
    second = 0.0
    while not found or None in found.values():
        second += 1.0
        found = watch.check_all(live, second)
        assert second < 20, "never stalled"
    stalled = dict(found)
    for _ in range(10):   # asked where they are every second ("Where are they?", a report)
        second += 1.0
        sample({0: 1, 1: 2})
        watch.asked(second)
        assert watch.check_all(live, second) == stalled, second
    second += STACK_GAP
    cpu[1] += 0.9         # rank 0 computes again: that is a sign
    assert watch.check_all(live, second + 1.0) == stalled    # the first read after an answer sets a baseline
    cpu[1] += 0.9
    assert watch.check_all(live, second + 2.0) == {0: None, 1: None}
