"""Interrupts stop every rank and re-raise; ranks die with the parent; 50 launches leak nothing."""
import gc
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time

import psutil
import pytest
from helpers.fd_helpers import fd_links

from notebook_launch import LaunchError, notebook_launcher
from helpers.processes import children
from helpers.waiting import ended, wait_for

HANGING_LAUNCH = textwrap.dedent("""
    import os, sys, time
    from notebook_launch import notebook_launcher

    def hang(folder):
        open(os.path.join(folder, f"rank{os.environ['RANK']}.pid"), "w").write(str(os.getpid()))
        try:
            while True:
                time.sleep(0.1)
        except KeyboardInterrupt:
            return "swallowed the interrupt"   # a rank must not turn an interrupt into success

    try:
        notebook_launcher(hang, args=(sys.argv[1],), num_processes=3)
        print("RETURNED", flush=True)
    except KeyboardInterrupt as interrupt:
        print("KEYBOARDINTERRUPT", interrupt, flush=True)
""")


def start_hanging_launch(tmp_path):
    script = tmp_path / "hang.py"
    script.write_text(HANGING_LAUNCH)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("rank*.pid"))) < 3:
        assert proc.poll() is None, proc.stdout.read()
        assert time.monotonic() < deadline, "ranks did not start"
        time.sleep(0.05)
    time.sleep(0.2)
    pids = [int(p.read_text()) for p in tmp_path.glob("rank*.pid")]
    return proc, pids


def wait_gone(pids, seconds):
    return wait_for(lambda: all(ended(p) for p in pids), seconds)


@pytest.mark.parametrize("how", ["SIGINT to the kernel process", "SIGINT to the kernel's process group"])
def test_interrupt_stops_every_rank_and_reraises(tmp_path, how):
    proc, pids = start_hanging_launch(tmp_path)
    start = time.monotonic()
    if how == "SIGINT to the kernel process":
        os.kill(proc.pid, signal.SIGINT)
    else:
        os.killpg(proc.pid, signal.SIGINT)  # what Jupyter's interrupt does
    out, _ = proc.communicate(timeout=60)
    assert wait_gone(pids, 5 - (time.monotonic() - start) + 1), "ranks outlived the interrupt"
    assert "KEYBOARDINTERRUPT" in out and "RETURNED" not in out, out
    if how == "SIGINT to the kernel process":   # the ranks did not get it: the interrupt says where they were
        said = out.split("KEYBOARDINTERRUPT notebook_launch: interrupted; where the ranks were: ")[1].splitlines()[0]
        named = re.findall(r"ranks? ([\d, ]+) (?:is|are) in hang\(\) at hang\.py:\d+", said)
        assert sorted(int(r) for group in named for r in group.split(",")) == [0, 1, 2], out


def test_ranks_die_with_the_parent(tmp_path):
    proc, pids = start_hanging_launch(tmp_path)
    proc.kill()  # SIGKILL: the parent gets no chance to clean up
    proc.wait(timeout=30)
    assert wait_gone(pids, 5), "ranks outlived their parent (PR_SET_PDEATHSIG)"


def ok(i):
    return i


def boom(i):
    raise RuntimeError(f"launch {i} fails")


def early_exit(i):
    os._exit(7)


def resources():
    gc.collect()  # objects of earlier tests (sockets, files) must not close during the count
    me = psutil.Process()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP,
                                                 signal.SIGQUIT, signal.SIGCHLD)}
    return {"fds": sorted(fd_links().values()), "threads": threading.active_count(), "os_threads": me.num_threads(),
            "handlers": handlers, "env": dict(os.environ),
            "sockets": sorted((c.laddr, c.status) for c in me.net_connections(kind="inet"))}


def test_fifty_launches_in_a_row_leak_nothing(tmp_path):
    notebook_launcher(ok, args=(0,), num_processes=2, log_dir=str(tmp_path / "warm"))  # lazy imports
    before = resources()
    for i in range(50):
        fn = (ok, boom, early_exit)[i % 3]
        try:
            result = notebook_launcher(fn, args=(i,), num_processes=2, log_dir=str(tmp_path / str(i)))
            assert result == [i, i]
        except LaunchError as err:
            assert fn is not ok, err
    after = resources()
    assert children() == [], "a child or zombie is left"
    assert after["fds"] == before["fds"], \
        f"file descriptors leaked: {len(before['fds'])} -> {len(after['fds'])}: " \
        f"{sorted(set(after['fds']) ^ set(before['fds']))}"
    assert (after["threads"], after["os_threads"]) == (before["threads"], before["os_threads"]), \
        f"threads: {before['threads']}/{before['os_threads']} -> {after['threads']}/{after['os_threads']}"
    assert after["handlers"] == before["handlers"], "signal handlers were not restored"
    assert after["env"] == before["env"]
    assert after["sockets"] == before["sockets"], f"sockets: {before['sockets']} -> {after['sockets']}"
