"""Press the panel's Stop button again and again in ONE real kernel, optionally
with busy loops on every core, and check the kernel survives each time.

Not a pytest test (it runs for minutes): a reproduction tool for "the kernel
died after Stop". The kernel's stderr goes to a file, where libzmq's abort
("Bad file descriptor (src/signaler.cpp:...)") would show.

    .venv/bin/python tests/stress_stop_button.py --runs 10 --hog 2
"""
from __future__ import annotations

import argparse
import multiprocessing
import queue
import re
import sys
import time

from helpers.nbutil import start_kernel  # tests/ is this script's folder: first on sys.path

CELL = '''
from notebook_launch import notebook_launcher, progress

def train_slow(n):
    import time
    for i in progress(range(n), desc="slow"):
        time.sleep(0.01)
    return "never"

notebook_launcher(train_slow, args=(100_000,), num_processes=2)
'''


def busy():
    while True:
        pass


def one_stop(kc, timeout=300) -> str:
    """Run the launch, click Stop once a bar moved; return what the cell ended with."""
    msg_id = kc.execute(CELL, stop_on_error=False)
    stop_comm, progressed = None, False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not (stop_comm and progressed):
        msg = kc.get_iopub_msg(timeout=timeout)
        content = msg["content"]
        if msg["msg_type"] == "comm_open":
            state = content["data"].get("state", {})
            if state.get("_model_name") == "ButtonModel" and state.get("description") == "Stop":
                stop_comm = content["comm_id"]
        elif msg["msg_type"] == "comm_msg":
            state = content["data"].get("state", {})
            value = state.get("value")   # the rows' HTML (display/rows.py): a bar moved
            if isinstance(value, str) and re.search(r"class='nl-bar' style='width:(?!0\.0%)[\d.]+%", value):
                progressed = True
    if not stop_comm:
        return "no Stop button"
    kc.shell_channel.send(kc.session.msg("comm_msg", {"comm_id": stop_comm, "data": {
        "method": "custom", "content": {"event": "click"}}}))
    while time.monotonic() < deadline:
        try:
            reply = kc.get_shell_msg(timeout=30)
        except queue.Empty:
            continue
        if reply["msg_type"] == "execute_reply" and reply["parent_header"]["msg_id"] == msg_id:
            return reply["content"].get("ename") or reply["content"]["status"]
    return "no reply"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--hog", type=int, default=0, help="busy-loop processes to start")
    parser.add_argument("--stderr", default="kernel-stderr.log")
    args = parser.parse_args()
    hogs = [multiprocessing.Process(target=busy, daemon=True) for _ in range(args.hog)]
    for hog in hogs:
        hog.start()
    stderr = open(args.stderr, "w")
    km, kc = start_kernel("python3", stderr=stderr)
    failures = 0
    try:
        kc.execute_interactive("import ipywidgets", timeout=300)
        for run in range(1, args.runs + 1):
            started = time.monotonic()
            ended = one_stop(kc)
            time.sleep(1)
            alive, after_status = km.is_alive(), "not run"
            if alive:
                after = kc.execute_interactive("print('AFTER STOP CELL RAN')", timeout=300,
                                               output_hook=lambda msg: None)
                after_status = after["content"]["status"]
                alive = km.is_alive()
            ok = ended == "KeyboardInterrupt" and after_status == "ok" and alive
            failures += not ok
            print(f"run {run}: cell ended with {ended}; next cell {after_status}; "
                  f"kernel alive {alive}; {time.monotonic() - started:.0f} s", flush=True)
            if not alive:
                break
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)
        stderr.close()
        for hog in hogs:
            hog.kill()   # SIGKILL
    text = open(args.stderr).read()
    aborted = "Bad file descriptor" in text or "signaler.cpp" in text
    print(f"{args.runs} runs, {failures} failed; zmq abort in kernel stderr: {aborted}")
    sys.exit(1 if failures or aborted else 0)


if __name__ == "__main__":
    main()
