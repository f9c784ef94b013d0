"""Only the user's code in what a cell shows (issue 35): in a real kernel, every way a run ends
or is looked at (a launch, a persistent call, the magics, the kernel's interrupt, a timeout,
``ranks.stacks()`` and ``%ranks stacks``, a syntax error in a magic's cell) shows no frame or
thread of notebook_launch (``helpers.only_users_code``), and says how many frames it hid. The
ranks use ``progress()`` (its sender thread is ours) and persistent calls run through our serve
loop and namespace, whose frames the stacks used to list. The Stop button's path is
``test_stop_button``'s, scanned there.

The kernel interrupts itself, as its stop button does: a rank sends SIGINT to the kernel once
every rank of the run is in the user's function (the files it waits for say so)."""
from __future__ import annotations

import pytest

from helpers.only_users_code import assert_only_users_code, traces_of_ours

pytestmark = pytest.mark.timeout(600)

SETUP = '''\
import os, signal, threading, time
from notebook_launch import notebook_launcher, progress, start_ranks
%load_ext notebook_launch
KERNEL = os.getpid()
FOLDER = {folder!r}

def all_here(tag, n=2):
    """Mark this rank as in the user's code; wait until every rank is (no timed wait)."""
    open(os.path.join(FOLDER, f"{{tag}}-{{os.environ['RANK']}}"), "w").close()
    while len([f for f in os.listdir(FOLDER) if f.startswith(tag + "-")]) < n:
        time.sleep(0.01)

def interrupt_the_kernel(tag):
    for _ in progress(range(3), desc="work"):
        pass
    all_here(tag)
    if os.environ["RANK"] == "0":
        os.kill(KERNEL, signal.SIGINT)
    time.sleep(600)

def hang():
    for _ in progress(range(3), desc="work"):
        pass
    time.sleep(600)
'''

LAUNCH_INTERRUPTED = "notebook_launcher(interrupt_the_kernel, args=('launch',), num_processes=2, ui='text')"
CAUGHT = '''\
try:
    notebook_launcher(interrupt_the_kernel, args=('caught',), num_processes=2, ui='text')
except KeyboardInterrupt as interrupt:
    print("CAUGHT", isinstance(interrupt, KeyboardInterrupt))'''
MAGIC_INTERRUPTED = "%%launch -n 2 --ui text\ninterrupt_the_kernel('magic')"
MAGIC_SYNTAX = "%%launch -n 2 --ui text\nx = (1,\ny = 2"
# generous timeouts: the stacks are taken when they fire, and the ranks must be in hang() by then
TIMEOUT = "notebook_launcher(hang, num_processes=2, ui='text', timeout=20)"
START = "ranks = start_ranks(num_processes=2, ui='text')"
CALL = "ranks.run(lambda: sum(progress(range(5))))"
STACKS_DURING_A_CALL = '''\
STACKS = None
def ask_during_the_call():
    global STACKS
    while len([f for f in os.listdir(FOLDER) if f.startswith("during-")]) < 2:
        time.sleep(0.01)
    try:
        STACKS = str(ranks.stacks())
    finally:   # the call ends whatever happened here (the test then says what)
        open(os.path.join(FOLDER, "asked"), "w").close()
threading.Thread(target=ask_during_the_call).start()'''
RANKS_CELL = '''\
%%ranks
for _ in progress(range(3), desc="work"):
    pass
all_here("during")
while not os.path.exists(os.path.join(FOLDER, "asked")):
    time.sleep(0.01)'''
PRINT_STACKS = "print(STACKS)"
STACKS_BETWEEN_CALLS = "%ranks stacks"
RANKS_SYNTAX = "%%ranks\nz = [1,"
CALL_INTERRUPTED = "ranks.run(interrupt_the_kernel, args=('call',))"
CALL_TIMEOUT = "ranks.run(hang, timeout=20)"
CLOSE = "ranks.close()"
# the widget panel: a run that stalls says where its ranks are in the panel; a person at the
# panel (its refresh, here) presses Stop once it did, so the final picture holds the stacks
STOP_A_STALLED_RUN = '''\
from notebook_launch.display import choose_display
panel = choose_display('widget')
draw = panel.refresh
def refresh(state):
    draw(state)
    if state.where_report is not None:
        state.stop_requested = True
panel.refresh = refresh
notebook_launcher(hang, num_processes=2, ui=panel, stall_after=2)'''

CELLS = [SETUP, LAUNCH_INTERRUPTED, CAUGHT, MAGIC_INTERRUPTED, MAGIC_SYNTAX, TIMEOUT, START, CALL,
         STACKS_DURING_A_CALL, RANKS_CELL, PRINT_STACKS, STACKS_BETWEEN_CALLS, RANKS_SYNTAX, CALL_INTERRUPTED,
         CALL_TIMEOUT, CLOSE, STOP_A_STALLED_RUN]


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    pytest.importorskip("nbclient")
    from helpers.nbutil import make_notebook, run_notebook
    folder = tmp_path_factory.mktemp("marks")
    cells = [SETUP.format(folder=str(folder))] + CELLS[1:]
    return run_notebook(make_notebook(*cells), allow_errors=True, cwd=str(folder))


def cell(executed, source: str):
    return executed.cells[CELLS.index(source)]


def error_of(executed, source: str):
    errors = [out for out in cell(executed, source).outputs if out.output_type == "error"]
    assert len(errors) == 1, cell(executed, source).outputs
    return errors[0]


@pytest.mark.parametrize("source", CELLS, ids=[
    "setup", "launch-interrupted", "caught", "magic-interrupted", "magic-syntax", "timeout", "start", "call",
    "ask", "ranks-cell", "stacks-during-a-call", "stacks-between-calls", "ranks-syntax", "call-interrupted",
    "call-timeout", "close", "stop-a-stalled-run"])
def test_no_cell_shows_a_frame_or_thread_of_ours(executed, source):
    assert_only_users_code(cell(executed, source), executed)


@pytest.mark.parametrize("source, number", [(LAUNCH_INTERRUPTED, 2), (MAGIC_INTERRUPTED, 4),
                                            (CALL_INTERRUPTED, 14)])
def test_an_interrupt_shows_the_users_cell_and_says_ours_were_hidden(executed, source, number):
    error = error_of(executed, source)
    assert error.ename == "KeyboardInterrupt", error
    text = assert_only_users_code(cell(executed, source))
    assert f"Cell In[{number}], line 1" in text, text
    assert "of notebook_launch hidden" in text, text
    assert "interactiveshell.py" not in text and "magic.py" not in text, text


def test_an_interrupt_is_still_caught_as_a_keyboard_interrupt(executed):
    assert "CAUGHT True" in assert_only_users_code(cell(executed, CAUGHT))


@pytest.mark.parametrize("source, number, line", [(MAGIC_SYNTAX, 5, "x = (1,"), (RANKS_SYNTAX, 13, "z = [1,")])
def test_a_magic_cells_syntax_error_shows_as_a_cells_own(executed, source, number, line):
    error = error_of(executed, source)
    assert error.ename == "SyntaxError", error
    text = assert_only_users_code(cell(executed, source))
    assert f"Cell In[{number}], line 1" in text and line in text, text
    assert "interactiveshell.py" not in text and "run_cell_magic" not in text, text


@pytest.mark.parametrize("source", [TIMEOUT, CALL_TIMEOUT])
def test_a_timeouts_stacks_hide_our_threads_and_frames(executed, source):
    text = assert_only_users_code(cell(executed, source))
    assert "hang() at Cell In[1]" in text, text
    assert "of notebook_launch hidden" in text, text


def test_a_stalled_run_stopped_shows_the_stacks_in_the_panel_and_is_headed_stopped(executed):
    error = error_of(executed, STOP_A_STALLED_RUN)
    assert error.ename == "LaunchError" and "stopped with the Stop button after the run stalled" in error.evalue
    pictures = [out.data["text/html"] for out in cell(executed, STOP_A_STALLED_RUN).outputs
                if out.output_type == "display_data" and "nl-panel" in out.data.get("text/html", "")]
    assert len(pictures) == 1
    picture = pictures[0]
    assert "nl-where-stacks" in picture and "hang() at Cell In[1]" in picture, picture
    assert "of notebook_launch hidden" in picture, picture
    assert "font-weight:bold'>stopped</span>" in picture, picture   # headed stopped, as an interrupt is
    assert_only_users_code(cell(executed, STOP_A_STALLED_RUN), executed)


def test_stacks_during_a_call_show_the_cell_not_our_serve_loop(executed):
    text = assert_only_users_code(cell(executed, PRINT_STACKS))
    assert "Cell In[10]" in text and "of notebook_launch hidden" in text, text


def test_a_call_that_went_well_ends_on_one_line(executed):
    """Not the run's whole summary (header, a line per rank, the outcome) for each call (issue 35)."""
    text = assert_only_users_code(cell(executed, CALL))
    assert [line for line in text.splitlines() if "ranks returned in" in line or "notebook_launch run" in line
            or line.startswith("  rank ")] == [next(line for line in text.splitlines() if "ranks returned in" in line)]


def test_percent_ranks_stacks_finds_ranks_started_with_start_ranks(executed):
    text = assert_only_users_code(cell(executed, STACKS_BETWEEN_CALLS))
    assert "no ranks are running" not in text and "every rank waits for the next one" in text, text


def test_the_scan_finds_what_the_cell_used_to_show():
    """The scan itself: what the cells showed before (issue 35's examples) is caught."""
    shown = ['File /x/notebook_launch/launcher.py:123, in notebook_launcher(function, args)',
             "    _run() at progress.py:140", "    interruptible() at serve.py:98",
             "    run_cell() at namespace.py:75", "thread notebook_launch-progress",
             "  File /x/notebook_launch/magic.py:242 in launch"]
    for text in shown:
        assert traces_of_ours(text), text
    assert not traces_of_ours("    train() at Cell In[5], line 12\n    wait() at threading.py:320\n"
                              "logs: /root/.cache/notebook_launch/runs/2026")
