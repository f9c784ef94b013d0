"""The panel's Stop button in a real kernel, clicked the way a browser clicks it:
a comm_msg {"method": "custom", "content": {"event": "click"}} on the shell channel
while the cell is still running. Also checks that a cell queued during the run
(as "Run All" queues them) still runs afterwards, in order."""
import queue
import re
import time

import pytest
from helpers.nbutil import start_kernel
from helpers.only_users_code import traces_of_ours

jupyter_client = pytest.importorskip("jupyter_client")
pytest.importorskip("ipywidgets")

CELL = '''
from notebook_launch import notebook_launcher, progress

def train_slow(n):
    import time
    for i in progress(range(n), desc="slow"):
        time.sleep(0.01)
    return "never"

notebook_launcher(train_slow, args=(100_000,), num_processes=2)
'''


def test_stop_button_click_interrupts_the_run_and_later_cells_still_run(tmp_path):
    # The kernel's stderr goes to a file: a libzmq abort ("Bad file descriptor") shows there.
    stderr = open(tmp_path / "kernel-stderr.log", "w")
    km, kc = start_kernel("python3", stderr=stderr)
    try:
        kc.execute_interactive("import ipywidgets", timeout=120)
        for _round in range(2):   # twice in one kernel: a kernel killed by the first Stop shows here
            # stop_on_error=False: otherwise Jupyter (rightly) aborts cells queued behind an error
            launch_id = kc.execute(CELL, stop_on_error=False)
            later_id = kc.execute("print('LATER CELL RAN')")      # queued behind the running cell
            stop_comm, progressed, texts = None, False, []
            shown: list[str] = []   # what the panel's displays carried
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline and not (stop_comm and progressed):
                msg = kc.get_iopub_msg(timeout=60)
                content = msg["content"]
                if msg["msg_type"] == "comm_open":
                    state = content["data"].get("state", {})
                    if state.get("_model_name") == "ButtonModel" and state.get("description") == "Stop":
                        stop_comm = content["comm_id"]
                elif msg["msg_type"] == "comm_msg":
                    state = content["data"].get("state", {})
                    value = state.get("value")
                    # a bar moved (the rows' HTML: display/rows.py): the run is under way
                    if isinstance(value, str) and re.search(r"class='nl-bar' style='width:(?!0\.0%)[\d.]+%", value):
                        progressed = True
            assert stop_comm, "the panel showed no Stop button"
            click = kc.session.msg("comm_msg", {"comm_id": stop_comm, "data": {
                "method": "custom", "content": {"event": "click"}}})
            kc.shell_channel.send(click)
            replies: dict[str, dict] = {}   # msg_id of the request -> its execute_reply's content
            while len(replies) < 2 and time.monotonic() < deadline:
                try:
                    reply = kc.get_shell_msg(timeout=60)
                except queue.Empty:
                    break
                if reply["msg_type"] == "execute_reply":
                    replies[reply["parent_header"]["msg_id"]] = reply["content"]
            while True:   # collect what the cells printed
                try:
                    msg = kc.get_iopub_msg(timeout=2)
                except queue.Empty:
                    break
                if msg["msg_type"] == "stream":
                    texts.append(msg["content"]["text"])
                if msg["msg_type"] == "error":
                    texts.append("\n".join(msg["content"]["traceback"]))
                if msg["msg_type"] in ("display_data", "update_display_data"):   # the panel's final picture
                    shown.extend(str(value) for value in msg["content"]["data"].values())
            assert launch_id in replies, f"the launch did not end after the click: {replies}"
            assert replies[launch_id]["status"] == "error"
            assert replies[launch_id]["ename"] == "KeyboardInterrupt", replies[launch_id]
            assert "Stop button" in replies[launch_id]["evalue"]
            assert later_id in replies and replies[later_id]["status"] == "ok"
            assert "LATER CELL RAN" in "".join(texts)
            # what the cell shows holds no frame or thread of ours (issue 35)
            assert any("nl-panel" in picture for picture in shown), shown
            assert not traces_of_ours("".join(texts + shown)), "".join(texts + shown)
            assert km.is_alive(), "the kernel died after Stop"
        stderr.flush()
        aborts = [line for line in (tmp_path / "kernel-stderr.log").read_text().splitlines()
                  if "Bad file descriptor" in line or ".cpp:" in line]
        assert not aborts, f"libzmq aborted in the kernel: {aborts}"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
        stderr.close()
