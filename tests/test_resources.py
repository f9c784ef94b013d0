"""Each rank's resources, live (issue 34 item 1): CPU, resident memory and what of it is the rank's
own (a forked rank shares the notebook's pages), its GPU through NVML (a fake here: no GPU can
exist on these machines; the real one in tests/gpu), the machine's memory in the header, the final
picture and the rank logs. Real ranks; every wait is for a condition the notebook side saw."""
from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import subprocess
import sys
import time

import pytest
from helpers.fake_nvml import FakeDevice, FakeNvml
from helpers.panel_helpers import KeepStateDisplay

from notebook_launch import notebook_launcher
from notebook_launch.display import format as fmt
from notebook_launch.display import fragments, rows
from notebook_launch.display.rich_panel import render
from notebook_launch.record.resources import GpuUsage, MachineMemory, RankUsage, size_text
from notebook_launch.record.state import DONE, RUNNING, RankState, RunState
from notebook_launch.supervise.resources import ResourceSampler

MiB = 1 << 20
ALLOCATED = 200 * MiB
INHERITED = 300 * MiB
OWN = re.compile(r"([\d.]+) MiB own of ")   # a row's own memory, in MiB
WAIT = 120.0   # a rank waits at most this long for the notebook to see it; the test then fails


def touched(size: int) -> bytearray:
    """``size`` bytes, every page written, so they are resident (bytearray alone maps zero pages)."""
    block = bytearray(size)
    block[::4096] = b"\1" * len(range(0, size, 4096))
    return block


def wait_for_file(path: str) -> bool:
    deadline = time.monotonic() + WAIT
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


class SeeingDisplay(KeepStateDisplay):
    """A real Display that, on each refresh, writes ``sentinel`` once ``seen(state)`` holds and
    keeps the rank rows and header it drew at that moment."""

    def __init__(self, seen, sentinel: str) -> None:
        super().__init__()
        self.seen, self.sentinel = seen, sentinel
        self.rows: list[str] = []
        self.header = ""
        self.usage: list[RankUsage | None] = []

    def refresh(self, state: RunState) -> None:
        if not self.rows and self.seen(state):
            self.rows = [fmt.rank_line(rs) for rs in state.ranks]
            self.header = fmt.header(state)
            self.usage = [rs.resources for rs in state.ranks]
            pathlib.Path(self.sentinel).touch()


def launch_seeing(seen, sentinel, function, **options) -> tuple[list, SeeingDisplay]:
    display = SeeingDisplay(seen, sentinel)
    return notebook_launcher(function, ui=display, **options), display


def allocate_then_wait(sentinel: str) -> bool:
    """Rank 0 holds ALLOCATED bytes until the notebook saw them; rank 1 holds nothing extra."""
    block = touched(ALLOCATED) if os.environ["RANK"] == "0" else None
    seen = wait_for_file(sentinel)
    del block
    return seen


def test_a_rank_that_allocates_shows_it_in_its_row_header_summary_and_log(tmp_path, log_dir):
    sentinel = str(tmp_path / "seen")

    def seen(state: RunState) -> bool:   # rank 0's 200 MiB as its own, and rank 1's own memory read too
        owns = [None if rs.resources is None else rs.resources.uss for rs in state.ranks]
        return all(own is not None for own in owns) and (owns[0] or 0) >= ALLOCATED

    results, display = launch_seeing(seen, sentinel, allocate_then_wait, args=(sentinel,),
                                     num_processes=2, log_dir=log_dir)
    assert results == [True, True], "the notebook never saw rank 0's memory"
    mine, other = display.usage
    assert mine is not None and other is not None
    assert mine.rss >= ALLOCATED and other.uss is not None and other.uss < ALLOCATED / 2
    # the text row (what the text and HTML displays and the summary print) says it, as MiB
    row = display.rows[0]
    assert " own of " in row and "resident" in row and "cpu " in row, row
    own = OWN.search(row)
    assert own is not None and float(own.group(1)) >= 200, row
    # the header: the machine's memory, total and available
    state = display.state
    assert state is not None and state.machine is not None
    assert f"machine memory {size_text(state.machine.total)}" in display.header, display.header
    assert "available" in display.header
    # the final picture: the rank ended, so its peak and its average CPU
    final = fmt.summary(state)
    assert "peak " in final and "avg cpu " in final, final
    final_usage = state.ranks[0].resources
    assert final_usage is not None and (final_usage.peak_uss or 0) >= ALLOCATED
    # each rank's log has a resources line (from when its own memory was first read)
    for rank in (0, 1):
        text = pathlib.Path(log_dir, f"rank{rank}.log").read_text()
        assert "[notebook_launch] resources: " in text and "(USS)" in text and "(PSS)" in text, text


def allocate_and_return() -> int:
    """ALLOCATED bytes held for a moment, then the rank returns: it ends long before the notebook's
    once-a-second sampling could catch it holding them."""
    block = touched(ALLOCATED)
    return len(block)


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_a_rank_that_ended_before_any_sample_still_shows_its_peak(start_method, log_dir):
    """A run of a fraction of a second: the kernel's count of each reaped rank's life (wait4's peak
    resident memory) is in its row and the final picture, where the samples saw nothing of it (a
    rank once ended before the first sample and its row in the final picture had no memory at
    all). Without the kernel's count the peak is what a sample caught: never the 200 MiB a rank
    held for some milliseconds after the first round."""
    display = KeepStateDisplay()
    assert notebook_launcher(allocate_and_return, num_processes=2, ui=display, log_dir=log_dir,
                             start_method=start_method) == [ALLOCATED] * 2
    for rs in display.state.ranks:
        assert rs.resources is not None, "a rank's row shows no memory"
        assert rs.resources.peak_rss >= ALLOCATED, rs.resources
    final = fmt.summary(display.state)
    assert final.count("peak ") == 2, final
    # each rank's log says it too: the line over its life (a rank this short never got the periodic
    # line, which waits for its own pages to be read: the GPU lane found such a log empty)
    for rank in (0, 1):
        text = pathlib.Path(log_dir, f"rank{rank}.log").read_text()
        life = [line for line in text.splitlines() if "[notebook_launch] resources over its life: " in line]
        assert len(life) == 1, text
        peak = re.search(r"([\d.]+) (MiB|GiB) resident at its peak", life[0])
        unit = MiB if peak is not None and peak.group(2) == "MiB" else 1024 * MiB
        assert peak is not None and float(peak.group(1)) * unit >= ALLOCATED, life
        assert "of a core on average" in life[0], life


INHERITED_BLOCK: bytearray | None = None


def read_inherited_then_wait(sentinel: str) -> int:
    """Read every page of the notebook's block (copy-on-write: nothing is copied), then wait."""
    assert INHERITED_BLOCK is not None
    total = sum(INHERITED_BLOCK[::4096])
    wait_for_file(sentinel)
    return total


def test_a_forked_ranks_pages_shared_with_the_notebook_are_not_its_own(tmp_path, log_dir):
    global INHERITED_BLOCK
    INHERITED_BLOCK = touched(INHERITED)
    sentinel = str(tmp_path / "seen")

    def seen(state: RunState) -> bool:
        usage = state.ranks[0].resources
        return usage is not None and usage.rss >= INHERITED and usage.uss is not None

    try:
        results, display = launch_seeing(seen, sentinel, read_inherited_then_wait,
                                         args=(sentinel,), num_processes=1, start_method="fork", log_dir=log_dir)
    finally:
        INHERITED_BLOCK = None
    assert results == [len(range(0, INHERITED, 4096))]
    usage = display.usage[0]
    assert usage is not None and usage.uss is not None and usage.pss is not None
    # resident counts the inherited block; own (USS) does not; PSS splits it with the notebook
    assert usage.rss >= INHERITED and usage.uss < usage.rss - INHERITED * 0.8, usage
    assert usage.shared is not None and usage.shared >= INHERITED * 0.8
    assert usage.pss < usage.rss
    row = display.rows[0]
    own = OWN.search(row)
    assert own is not None and float(own.group(1)) < 100, row


def test_a_gpu_ranks_device_comes_from_nvml_found_by_its_process(monkeypatch):
    """With a fake NVML (no GPU exists here): the device that lists the rank's process is its
    device, whatever its index; where none lists it, CUDA_VISIBLE_DEVICES maps cuda:N."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        fake = FakeNvml([FakeDevice("GPU-a", 16 << 30, 1 << 30, 5),
                         FakeDevice("GPU-b", 16 << 30, 3 << 30, 87, {child.pid: 3 << 29})])
        monkeypatch.setitem(sys.modules, "pynvml", fake)
        sampler = ResourceSampler()
        assert sampler.sample({0: child.pid}, {0: "cuda:0"}, now=1.0)
        gpu = sampler.usage[0].gpu
        assert gpu == GpuUsage(index=1, used=3 << 30, total=16 << 30, utilization=87, process_used=3 << 29)
        state = RunState("r", 1, "fork", "/tmp/logs", [RankState(0, 0, device="cuda:0")])
        state.on_resources(sampler.usage, sampler.machine)
        assert "GPU 1 3.0 GiB of 16.0 GiB (this rank 1.5 GiB), 87% busy" in fmt.rank_line(state.ranks[0])
        fake.devices[1].processes.clear()   # not listed (another PID namespace): the visible devices say
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-a,GPU-b")
        assert sampler.sample({0: child.pid}, {0: "cuda:1"}, now=10.0)
        assert sampler.usage[0].gpu == GpuUsage(index=1, used=3 << 30, total=16 << 30, utilization=87)
        sampler.close()
        assert fake.calls.count("nvmlInit") == 1 and fake.calls[-1] == "nvmlShutdown"
    finally:
        child.kill()
        child.wait()


def test_cpu_ranks_never_open_nvml(monkeypatch, log_dir):
    """NVML is opened only for a rank on a GPU: a CPU launch leaves it alone (the stand-in records
    any call), and the real pynvml is not imported by a CPU run's sampling."""
    fake = FakeNvml([FakeDevice("GPU-a", 16 << 30, 1 << 30, 5)])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert notebook_launcher(os.getpid, num_processes=2, log_dir=log_dir, ui="text")
    assert fake.calls == []


def test_a_gpu_without_nvml_shows_no_device_and_the_row_still_shows_the_rest(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)   # import pynvml raises ImportError
    sampler = ResourceSampler()
    assert sampler.sample({0: os.getpid()}, {0: "cuda:0"}, now=1.0)
    assert sampler.usage[0].gpu is None and sampler.usage[0].rss > 0


def test_cpu_use_of_a_busy_rank_is_measured_between_rounds():
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        sampler = ResourceSampler()
        sampler.sample({0: child.pid}, {}, now=time.monotonic())
        assert sampler.usage[0].cpu_percent is None   # one round: nothing to compare with yet
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:   # until the child got CPU time the kernel counted
            time.sleep(1.0)
            sampler.sample({0: child.pid}, {}, now=time.monotonic())
            if (sampler.usage[0].cpu_percent or 0) > 0:
                break
        assert (sampler.usage[0].cpu_percent or 0) > 0 and (sampler.usage[0].cpu_average or 0) > 0
    finally:
        child.kill()
        child.wait()


def sample_state(status=RUNNING) -> RunState:
    state = RunState("r", 1, "fork", "/tmp/logs", [RankState(0, 0, device="cuda:0", status=status)])
    state.on_resources({0: RankUsage(rss=1200 * MiB, uss=820 * MiB, pss=900 * MiB, cpu_percent=97.0,
                                     cpu_average=60.0, peak_rss=1500 * MiB, peak_uss=1000 * MiB,
                                     gpu=GpuUsage(0, 3 << 30, 16 << 30, 87))},
                       MachineMemory(24 << 30, 12 << 30))
    return state


def test_every_display_shows_the_same_words():
    """The text row, the HTML/widget row and header, and the rich panel (live and final) all say
    the rank's resources and the machine's memory in the one wording of ``resources.usage_text``."""
    state = sample_state()
    words = "cpu 97% · 820.0 MiB own of 1.2 GiB resident · GPU 0 3.0 GiB of 16.0 GiB, 87% busy"
    assert fmt.resources(state.ranks[0]) == words
    assert words in fmt.rank_line(state.ranks[0])
    assert "machine memory 24.0 GiB, 12.0 GiB available" in fmt.header(state)
    row = rows.row_html(state.ranks[0])
    assert "nl-resources" in row and "820.0 MiB own" in row
    assert "machine memory 24.0 GiB, 12.0 GiB available" in fragments.header_html(state)
    from rich.console import Console
    console = Console(width=400, record=True)
    console.print(render(state))
    drawn = console.export_text()
    assert "820.0 MiB own of 1.2 GiB resident" in drawn and "machine memory 24.0 GiB" in drawn, drawn
    state.ranks[0].status = DONE   # the final picture: its life's average CPU and its peak
    assert fmt.resources(state.ranks[0]).startswith("avg cpu 60% · peak 1000.0 MiB own of 1.5 GiB resident")


def test_a_rank_on_another_machine_shows_no_resources_until_it_reports_them():
    """(It reports them itself: tests/test_remote_resources.py.)"""
    state = RunState("r", 1, "ray", "/tmp/logs", [RankState(0, 0, node="node 1 (10.0.0.2)")])
    assert fmt.resources(state.ranks[0]) == "" and "[" not in fmt.rank_line(state.ranks[0]).split("]", 1)[1]


def test_own_memory_reads_take_turns_within_their_cpu_budget(monkeypatch):
    """smaps_rollup costs what the kernel's page-table walk costs: a round reads it for every rank
    not read yet (once each: every row of a picture says memory one way), then for the stalest
    ranks only while the batch is within budget (one rank at least), and the next batch waits in
    proportion to what this one cost; resident memory and CPU are read every round. (The share of
    a core is measured in benchmarks/resource_sampling.py, never timed here.)"""
    from notebook_launch.supervise import resources
    monkeypatch.setattr(resources, "DETAIL_BUDGET", 1e-12)   # any read is over it
    children = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"]) for _ in range(2)]
    try:
        pids = {local: child.pid for local, child in enumerate(children)}
        sampler = ResourceSampler()
        assert sampler.sample(pids, {}, now=1.0)   # the first round reads only the cheap files
        assert sampler.usage[0].uss is None and sampler.usage[0].rss > 0
        assert sampler.sample(pids, {}, now=2.0)
        assert sampler.usage[0].uss is not None and sampler.usage[1].uss is not None   # each once, budget or not
        assert sampler.next_detail > 1e6
        read_at = dict(sampler._own_at)
        assert sampler.sample(pids, {}, now=3.0)
        assert sampler._own_at == read_at and sampler.usage[1].cpu_percent is not None   # waiting: none read
        sampler.next_detail = 0.0    # the wait is over: the stalest rank's turn, and over budget after it
        assert sampler.sample(pids, {}, now=4.0)
        assert sampler._own_at == {0: 4.0, 1: read_at[1]}
        sampler.next_detail = 0.0
        assert sampler.sample(pids, {}, now=5.0)
        assert sampler._own_at == {0: 4.0, 1: 5.0}   # then the other's
        assert not sampler.sample(pids, {}, now=4.5)   # rounds: at most one every SAMPLE_EVERY
    finally:
        for child in children:
            child.kill()
            child.wait()


KERNEL_SETUP = '''
import os, time
from notebook_launch import notebook_launcher
import notebook_launch.supervise.resources as sampling

SENTINEL = {sentinel!r}
publish = sampling.ResourceSampler.publish

def publish_and_tell(self, state, logs, now=None):
    """Observes only: once rank 0's row holds its 200 MiB, the rank may go on."""
    publish(self, state, logs, now)
    usage = state.ranks[0].resources
    if usage is not None and usage.uss is not None and usage.uss >= 200 << 20:
        open(SENTINEL, "w").close()

sampling.ResourceSampler.publish = publish_and_tell

def train():
    block = bytearray(200 << 20) if os.environ["RANK"] == "0" else None
    if block is not None:
        block[::4096] = b"\\1" * len(range(0, len(block), 4096))
    deadline = time.monotonic() + 120
    while not os.path.exists(SENTINEL) and time.monotonic() < deadline:
        time.sleep(0.05)
    return os.path.exists(SENTINEL)
'''


def test_the_panel_in_a_real_kernel_shows_each_ranks_memory(tmp_path):
    """The widget panel in a real kernel (nbclient) ends as its picture: rank 0's row there says
    the 200 MiB it held as its own, the header the machine's memory."""
    from helpers.nbutil import make_notebook, run_notebook
    nb = run_notebook(make_notebook(KERNEL_SETUP.format(sentinel=str(tmp_path / "seen")),
                                    "notebook_launcher(train, num_processes=2)"), timeout=240, allow_errors=True)
    cell = nb.cells[1]
    results = [o.data["text/plain"] for o in cell.outputs if o.output_type == "execute_result"]
    assert results == ["[True, True]"], cell.outputs
    [picture] = [o for o in cell.outputs
                 if o.output_type == "display_data" and "nl-panel" in o.data.get("text/html", "")]
    page, summary = picture.data["text/html"], picture.data["text/plain"]
    assert page.count("class='nl-resources'") == 2 and "class='nl-machine'>machine memory " in page, page
    # rows come in rank order; the item's figures are spans of their own
    rank0 = re.sub(r"<[^>]+>", "", page.split("class='nl-resources'")[1].split("</span></span>")[0].split(">", 1)[1])
    assert " MiB own of " in rank0 and float(rank0.split(" MiB own")[0].rsplit("peak ", 1)[1]) >= 200, rank0
    assert "peak " in summary and "machine memory " in summary, summary


def test_every_row_of_one_picture_says_memory_the_same_way():
    """One rank's own pages were read, the other's not yet (the detail reads take turns): the rows
    once read "17.6 MiB own of 321.7 MiB resident" beside "327.3 MiB resident". Until every rank's
    own pages are known every row says resident memory; then every row says own of resident."""
    ranks = [RankState(0, 0, status=DONE), RankState(1, 1, status=DONE)]
    state = RunState("r", 2, "fork", "/tmp/logs", ranks)
    read = RankUsage(rss=320 * MiB, uss=18 * MiB, pss=100 * MiB, cpu_average=50.0, peak_rss=322 * MiB,
                     peak_uss=18 * MiB)
    unread = RankUsage(rss=327 * MiB, cpu_average=50.0, peak_rss=327 * MiB)
    state.on_resources({0: read, 1: unread}, None)
    rows = [fmt.resources(rs) for rs in state.ranks]
    assert rows == ["avg cpu 50% · peak 322.0 MiB resident", "avg cpu 50% · peak 327.0 MiB resident"], rows
    state.on_resources({1: dataclasses.replace(unread, uss=20 * MiB, peak_uss=20 * MiB)}, None)
    rows = [fmt.resources(rs) for rs in state.ranks]
    assert all(" own of " in row for row in rows), rows
