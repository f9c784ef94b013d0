"""A rank's CPU average in the final picture is over its whole life (issue 47, part 3): rows read
"avg cpu 0%" for ranks that clearly worked in runs of a second or two, because the last sample's
average (its CPU time over its age when sampled) stayed once the rank ended; a rank sampled early
and then busy said 0%. Now the kernel's count at the reap (wait4: its whole CPU time) over its
whole life replaces it."""
from __future__ import annotations

import os
import subprocess
import sys
import time

from notebook_launch import notebook_launcher
from notebook_launch.display.base import Display
from notebook_launch.supervise.resources import ResourceSampler

IDLE_THEN_BUSY = "import time; time.sleep(0.5); end = time.process_time() + 1.0\nwhile time.process_time() < end: pass"


def test_a_rank_sampled_while_idle_and_busy_after_gets_its_lifes_average():
    """Its average is its whole CPU time over its whole life, whatever the machine's load made
    of either (checked against the same figures read here), not the idle start's sample."""
    from notebook_launch.record.proc_usage import cpu_times
    child = subprocess.Popen([sys.executable, "-c", IDLE_THEN_BUSY])
    sampler = ResourceSampler()
    time.sleep(0.3)
    sampler.sample({0: child.pid}, {0: "cpu"})
    times = cpu_times(child.pid)
    assert times is not None
    born = time.monotonic() - times[1]
    _, status, rusage = os.wait4(child.pid, 0)
    child.returncode = 0   # reaped here (Popen must not wait again)
    assert status == 0
    cpu = rusage.ru_utime + rusage.ru_stime
    assert cpu >= 0.9, cpu                      # it did a second of work
    now = time.monotonic()
    sampler.ended(0, rusage.ru_maxrss * 1024, cpu, now=now)
    average = sampler.usage[0].cpu_average
    assert average is not None and abs(average - 100 * cpu / (now - born)) < 2, (average, cpu, now - born)


class LastPicture(Display):
    name = "last picture"

    def close(self, state) -> None:
        self.averages = {rs.rank: rs.resources.cpu_average if rs.resources else None for rs in state.ranks}


def idle_then_busy():
    """Return this process's own CPU time and age as it returns, from its side."""
    import os
    import time
    time.sleep(0.5)
    end = time.process_time() + 1.0
    while time.process_time() < end:
        pass
    ticks = os.sysconf("SC_CLK_TCK")
    with open(f"/proc/{os.getpid()}/stat") as f:
        started = int(f.read().rpartition(")")[2].split()[19]) / ticks
    with open("/proc/uptime") as f:
        age = float(f.read().split()[0]) - started
    return time.process_time(), age


def test_the_final_picture_shows_each_ranks_average_as_the_rank_itself_counts_it(tmp_path):
    display = LastPicture()
    results = notebook_launcher(idle_then_busy, num_processes=2, ui=display, log_dir=str(tmp_path))
    for rank, (cpu, age) in enumerate(results):
        shown = display.averages[rank]
        own = 100 * cpu / age
        # the notebook's life of the rank ends at the reap, a little after the return: a bit lower
        assert shown is not None and 0.6 * own <= shown <= own * 1.05 + 1, (rank, shown, own)


def test_ranks_that_end_before_their_first_sample_still_get_their_average(tmp_path):
    """A launch of a function that returns at once: its ranks ended before a sampling round read
    their start time, and one row read "peak 19.7 MiB resident" beside "avg cpu 56% · ..."."""
    display = LastPicture()
    for attempt in range(3):
        notebook_launcher(print, num_processes=2, ui=display, log_dir=str(tmp_path / str(attempt)))
        assert all(average is not None for average in display.averages.values()), (attempt, display.averages)
