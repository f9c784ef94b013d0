"""Ctrl-C pressed again and again while the ranks are stopped must not cut the teardown short
(issue 11, item D8): every rank ends and is reaped, no fd leaks, the panel says stopped, and
one KeyboardInterrupt reaches the caller."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and fork: Linux")

STORM = textwrap.dedent("""
    import json, os, signal, sys, time
    from pathlib import Path
    from notebook_launch import notebook_launcher

    def hold_memory_and_ignore_sigterm(folder):
        data = bytearray(256 << 20)
        for index in range(0, len(data), 4096):   # touch every page: resident, not just reserved
            data[index] = 1
        signal.signal(signal.SIGTERM, lambda signum, frame: None)
        Path(folder, f"{os.getpid()}.pid").write_text("")
        while True:
            time.sleep(0.05)

    def zombie_children():
        found = []
        for entry in filter(str.isdigit, os.listdir("/proc")):
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] == "Z" and int(fields[1]) == os.getpid():
                found.append(int(entry))
        return found

    late_presses = []
    signal.signal(signal.SIGINT, lambda signum, frame: late_presses.append(1))   # presses after the run
    fds_before = sorted(os.listdir("/proc/self/fd"))
    raised = []
    try:
        notebook_launcher(hold_memory_and_ignore_sigterm, args=(sys.argv[1],), num_processes=2, ui="text")
    except BaseException as exc:
        raised.append(type(exc).__name__)
    pids = [int(p.stem) for p in Path(sys.argv[1]).glob("*.pid")]
    print("OUTCOME " + json.dumps({
        "raised": raised, "ranks": pids, "ranks_left": [pid for pid in pids if os.path.exists(f"/proc/{pid}")],
        "zombies": zombie_children(), "fds_before": fds_before,
        "fds_after": sorted(os.listdir("/proc/self/fd"))}), flush=True)
""")


def test_repeated_interrupts_finish_the_teardown(tmp_path):
    script = tmp_path / "storm.py"
    script.write_text(STORM)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while len(list(tmp_path.glob("*.pid"))) < 2:
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "the ranks did not start"
            time.sleep(0.05)
        for _ in range(6):   # Ctrl-C, then five more presses 0.1 s apart
            proc.send_signal(signal.SIGINT)
            time.sleep(0.1)
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines = [line for line in output.splitlines() if line.startswith("OUTCOME ")]
    assert lines, output
    outcome = json.loads(lines[-1][len("OUTCOME "):])
    assert outcome["raised"] == ["KeyboardInterrupt"], output
    assert len(outcome["ranks"]) == 2
    assert outcome["ranks_left"] == [], f"ranks still exist after the launcher returned:\n{output}"
    assert outcome["zombies"] == [], output
    assert outcome["fds_after"] == outcome["fds_before"], output
    panel = output[output.rindex("notebook_launch run "):]   # the final summary of the text display
    assert ", stopped, " in panel.splitlines()[0], output
    assert panel.count("] stopped") == 2, output
