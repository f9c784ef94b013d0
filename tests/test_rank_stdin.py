"""A rank's input(), getpass() and pdb through a stdin-capable Jupyter client, and the
clear error where the client (or the process) cannot answer (issue 11, item B4)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from typing import Any

import pytest
from helpers.nbutil import cell_text, kernel_manager, make_notebook, run_notebook

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork ranks: Linux")


@dataclass
class Exchange:
    """What a stdin-capable frontend saw while a cell ran."""
    status: str
    prompts: list = field(default_factory=list)    # (prompt, password)
    output: str = ""


@pytest.fixture(scope="module")
def kernel():
    km = kernel_manager()
    km.start_kernel(cwd=os.getcwd())
    client = km.client()
    client.start_channels()
    client.wait_for_ready(timeout=120)
    try:
        yield client
    finally:
        client.stop_channels()
        km.shutdown_kernel(now=True)


def run_cell(client, source: str, answer) -> Exchange:
    """Execute ``source`` like JupyterLab does (allow_stdin=True); ``answer(prompt, password)``
    types the reply to each input_request."""
    seen = Exchange(status="")
    parts = []

    def on_input(msg):
        prompt, password = msg["content"]["prompt"], msg["content"]["password"]
        seen.prompts.append((prompt, password))
        typed = answer(prompt, password)
        if typed is not None:   # None: leave the prompt unanswered
            client.input(typed)

    def on_output(msg):
        content = msg["content"]
        if msg["msg_type"] == "stream":
            parts.append(content["text"])
        elif msg["msg_type"] == "error":
            parts.append(f"{content['ename']}: {content['evalue']}\n")
        elif msg["msg_type"] in ("display_data", "execute_result", "update_display_data"):
            parts.append(content.get("data", {}).get("text/plain", "") + "\n")

    reply = client.execute_interactive(textwrap.dedent(source), allow_stdin=True, stdin_hook=on_input,
                                       output_hook=on_output, timeout=300)
    seen.status = reply["content"]["status"]
    seen.output = "".join(parts)
    return seen


ASK_AND_DEBUG = """
from notebook_launch import notebook_launcher

from getpass import getpass as getpass_saved_in_the_notebook   # the kernel's own, under fork

def ask_then_debug(debug_rank):
    import getpass, os
    rank = int(os.environ["RANK"])
    name = input(f"name of rank {rank}? ")
    secret = getpass.getpass("secret? ")
    if getpass_saved_in_the_notebook("again? ") != secret:
        raise ValueError("the saved getpass got another answer")
    x = 41
    if rank == debug_rank:
        breakpoint()
        x += 1
    return name, secret, x
"""


def answers_by_rank(prompt: str, password: bool) -> str:
    rank = prompt.split("]")[0].split()[-1]   # "[rank 1] name of rank 1? " -> "1"
    return f"secret-{rank}" if password else f"name-{rank}"


def test_input_and_getpass_reach_the_frontend_tagged_with_the_rank(kernel):
    seen = run_cell(kernel, ASK_AND_DEBUG + "print('RESULT', notebook_launcher(ask_then_debug, args=(-1,), "
                    "num_processes=2, ui='text'))", answers_by_rank)
    assert seen.status == "ok", seen.output
    assert sorted(seen.prompts) == [("[rank 0] again? ", True), ("[rank 0] name of rank 0? ", False),
                                    ("[rank 0] secret? ", True), ("[rank 1] again? ", True),
                                    ("[rank 1] name of rank 1? ", False), ("[rank 1] secret? ", True)]
    assert "RESULT [('name-0', 'secret-0', 41), ('name-1', 'secret-1', 41)]" in seen.output


def test_breakpoint_gives_a_pdb_session_line_by_line(kernel):
    # Two "n": Python 3.13's breakpoint() stops on its own line (3.12 and older stop on the next one, x += 1),
    # so one "n" reaches x += 1 on 3.13 and the return on 3.12; the second reaches the return (3.13) or the
    # frame's return event (3.12, "--Return--"): x is 42 there on every Python.
    commands = iter(["p x", "n", "n", "p x + 100", "c"])

    def answer(prompt, password):
        return next(commands) if prompt.endswith("db> ") else answers_by_rank(prompt, password)

    seen = run_cell(kernel, ASK_AND_DEBUG + "print('RESULT', notebook_launcher(ask_then_debug, args=(1,), "
                    "num_processes=2))", answer)   # ui="auto": the widget panel, lines below it
    assert seen.status == "ok", seen.output
    debugger_prompts = [p for p, _ in seen.prompts if p.endswith("db> ")]
    assert len(debugger_prompts) == 5 and set(debugger_prompts) == {debugger_prompts[0]}
    assert debugger_prompts[0].startswith("[rank 1] ")
    assert "[rank 1] 41\n" in seen.output and "[rank 1] 142\n" in seen.output   # p x, then p x + 100 after n
    assert "RESULT [('name-0', 'secret-0', 41), ('name-1', 'secret-1', 42)]" in seen.output


def test_quitting_pdb_ends_that_rank_like_under_torchrun(kernel):
    seen = run_cell(kernel, ASK_AND_DEBUG + "notebook_launcher(ask_then_debug, args=(0,), num_processes=1, "
                    "ui='text')", lambda prompt, password: "q" if prompt.endswith("db> ")
                    else answers_by_rank(prompt, password))
    assert seen.status == "error"
    assert "rank 0 failed: BdbQuit" in seen.output


NO_STDIN_CELL = """
from notebook_launch import notebook_launcher

def wants_input():
    import os
    if os.environ["RANK"] == "1":
        return input("name? ")
    import time
    time.sleep(60)

notebook_launcher(wants_input, num_processes=2, ui="text")
"""


def test_a_frontend_without_stdin_gets_a_clear_error_naming_the_rank():
    nb = run_notebook(make_notebook(NO_STDIN_CELL), allow_errors=True, timeout=120)
    text = cell_text(nb.cells[0])
    assert "rank 1 failed: StdinUnavailableError: rank 1: input() needs an answer from the notebook" in text
    assert "does not accept input" in text and "allow_stdin=True" in text
    assert "rank 0: stopped by notebook_launch" in text    # the sleeping rank did not run its 60 s


NO_TTY_SCRIPT = """
from notebook_launch import notebook_launcher

def debug():
    breakpoint()
    return 1

notebook_launcher(debug, num_processes=1, ui="text")
"""


def test_a_script_without_a_terminal_gets_a_clear_error(tmp_path):
    script = tmp_path / "no_tty.py"
    script.write_text(NO_TTY_SCRIPT)
    done = subprocess.run([sys.executable, str(script)], stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode != 0
    assert ("rank 0 failed: StdinUnavailableError: rank 0: input() needs an answer from the notebook, but "
            "the notebook process has no terminal") in done.stderr


TERMINAL_SCRIPT = """
import getpass
from notebook_launch import notebook_launcher

def ask():
    return input("name? ") + ":" + getpass.getpass("password? ")

print("RESULT", notebook_launcher(ask, num_processes=1, ui="text"))
"""


def test_a_script_in_a_terminal_asks_there_and_hides_the_password(tmp_path):
    import pty
    import select
    script = tmp_path / "ask.py"
    script.write_text(TERMINAL_SCRIPT)
    pid, fd = pty.fork()
    if pid == 0:   # the child: the script, with the pty as its terminal
        os.execv(sys.executable, [sys.executable, str(script)])
    shown = b""
    answers = [(b"[rank 0] name? ", b"alice\n"), (b"[rank 0] password? ", b"s3cret\n")]
    try:
        while True:
            if not select.select([fd], [], [], 120)[0]:
                break
            try:
                data = os.read(fd, 4096)
            except OSError:   # EIO: the script ended and closed the terminal
                break
            if not data:
                break
            shown += data
            if answers and shown.endswith(answers[0][0]):
                os.write(fd, answers.pop(0)[1])
    finally:
        os.waitpid(pid, 0)
    text = shown.decode(errors="replace")
    assert "RESULT ['alice:s3cret']" in text, text
    assert "s3cret\r\n" not in text.split("RESULT")[0], "the password was echoed"


def test_a_spawned_rank_asks_too(kernel):
    """spawn starts a fresh interpreter: the relay is installed there as in a forked rank."""
    seen = run_cell(kernel, """
        from notebook_launch import notebook_launcher

        def ask_spawned():
            import getpass
            return input("name? "), getpass.getpass("secret? ")

        print("RESULT", notebook_launcher(ask_spawned, num_processes=1, start_method="spawn", ui="text"))
        """, answers_by_rank)
    assert seen.status == "ok", seen.output
    assert seen.prompts == [("[rank 0] name? ", False), ("[rank 0] secret? ", True)]
    assert "RESULT [('name-0', 'secret-0')]" in seen.output


def test_an_interrupt_while_a_rank_waits_at_a_prompt_stops_the_run_and_the_kernel_stays_usable(kernel):
    def interrupt_instead(prompt, password):
        # the user presses the stop button instead of typing (a client's parent is the KernelManager that made it)
        kernel.parent.interrupt_kernel()
        return None

    seen = run_cell(kernel, """
        import os
        from notebook_launch import notebook_launcher

        def waits_for_an_answer(folder):
            # Written whole or not at all: the interrupt's SIGTERM can land between open() and write().
            path = os.path.join(folder, f"rank{os.environ['RANK']}.pid")
            open(path + ".tmp", "w").write(str(os.getpid()))
            os.replace(path + ".tmp", path)
            return input("name? ")

        folder = __import__("tempfile").mkdtemp()
        notebook_launcher(waits_for_an_answer, args=(folder,), num_processes=2, ui="text")
        """, interrupt_instead)
    assert seen.status == "error" and "KeyboardInterrupt" in seen.output, seen.output
    assert seen.prompts and all(p.endswith("] name? ") for p, _ in seen.prompts)
    after = run_cell(kernel, """
        import psutil
        pids = [int(open(os.path.join(folder, f)).read()) for f in os.listdir(folder) if f.endswith(".pid")]
        def running(pid):   # a rank may be reaped between two looks: no pid_exists-then-Process
            try:
                return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                return False
        left = [p for p in pids if running(p)]
        print("LEFT", left, "TYPED", input("in the notebook itself? "))
        """, lambda prompt, password: "yes")
    assert after.status == "ok", after.output
    assert after.prompts == [("in the notebook itself? ", False)]
    assert "LEFT [] TYPED yes" in after.output


def test_other_ranks_output_keeps_flowing_while_a_prompt_waits(kernel):
    """The prompt does not block the supervisor: rank 0's lines reach the cell while rank 1
    waits, and only then is the prompt answered."""
    source = textwrap.dedent("""
        import os, tempfile, time
        from notebook_launch import notebook_launcher

        def tick_while_rank_1_asks(flag):
            if os.environ["RANK"] == "1":
                answer = input("go? ")
                open(flag, "w").close()
                return answer
            ticks = 0
            while not os.path.exists(flag) and ticks < 1200:
                print(f"tick {ticks}", flush=True)
                ticks += 1
                time.sleep(0.05)
            return ticks

        print("RESULT", notebook_launcher(tick_while_rank_1_asks, args=(tempfile.mktemp(),), num_processes=2,
                                          ui="text"))
        """)
    state: dict[str, Any] = {"asked": False, "ticks_after": 0, "answered": False, "text": []}

    def on_input(msg):
        state["asked"] = True

    def on_output(msg):
        if msg["msg_type"] != "stream":
            return
        state["text"].append(msg["content"]["text"])
        if state["asked"] and not state["answered"]:
            state["ticks_after"] += msg["content"]["text"].count("[rank 0] tick")
            if state["ticks_after"] >= 3:
                state["answered"] = True
                kernel.input("yes")

    reply = kernel.execute_interactive(source, allow_stdin=True, stdin_hook=on_input, output_hook=on_output,
                                       timeout=300)
    output = "".join(state["text"])
    assert reply["content"]["status"] == "ok", output
    assert state["answered"], "no line of rank 0 reached the cell while rank 1 waited at its prompt"
    assert "RESULT [" in output and ", 'yes']" in output
