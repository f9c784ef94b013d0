"""Persistent ranks in a real Jupyter kernel (nbclient): build, train, push, pull, an
exception, the kernel's interrupt, a crash and the restart that follows, close; and the
%ranks / %%ranks magics."""
import os
import threading
import time
from pathlib import Path

import psutil
import pytest
from helpers.nbutil import IOPUB_TIMEOUT, cell_text, kernel_manager, make_notebook, stop_kernel

pytestmark = pytest.mark.timeout(300)

SETUP = """
import os, time
import psutil
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from notebook_launch import start_ranks, LaunchError
from notebook_launch.planning.net import free_port

MARKERS = {markers!r}

def build(hidden):
    global model, optimizer, data
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(4, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.randn(32, 4), torch.randn(32, 1)
    return dist.get_rank()

def train_epoch():
    x, y = data
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return round(loss.item(), 6)

def set_lr():
    for group in optimizer.param_groups:
        group["lr"] = lr
    return optimizer.param_groups[0]["lr"]

def bad_batch():
    if dist.get_rank() == 1:
        raise RuntimeError("shape mismatch in batch 3")
    while True:
        time.sleep(0.01)

def evaluate_until_interrupted():
    # No collective inside: the interrupt lands in Python on every rank (an interrupt in the middle
    # of a DDP step usually catches one rank inside the gradient all_reduce: see the README).
    global interrupted
    open(os.path.join(MARKERS, f"running{{dist.get_rank()}}"), "w").close()
    x, _ = data
    try:
        with torch.no_grad():
            while True:
                model.module(x)
    except KeyboardInterrupt:
        interrupted = True
        raise

def still_there():
    return type(model.module).__name__, interrupted, dist.is_initialized(), os.getpid()

def crash():
    if dist.get_rank() == 0:
        os._exit(3)
    time.sleep(30)
"""


def execute_with_interrupts(nb, cwd, markers, ranks=2):
    """Run every cell; interrupt the kernel (as the notebook's stop button does) once every
    rank has written its marker, i.e. while the interrupt cell's ranks run."""
    from jupyter_client.provisioning.local_provisioner import LocalProvisioner
    from nbclient import NotebookClient

    km = kernel_manager()
    client = NotebookClient(nb, km=km, timeout=240, allow_errors=True, resources={"metadata": {"path": cwd}},
                            iopub_timeout=IOPUB_TIMEOUT)
    done = threading.Event()

    def interrupter():
        while not done.is_set():
            if all((Path(markers) / f"running{r}").exists() for r in range(ranks)):
                time.sleep(0.2)
                km.interrupt_kernel()
                return
            time.sleep(0.05)

    thread = threading.Thread(target=interrupter, daemon=True)
    thread.start()
    try:
        client.execute()
    finally:
        done.set()
        kernel_pid = None
        if km.has_kernel:
            assert isinstance(km.provisioner, LocalProvisioner) and km.provisioner.process is not None  # local
            kernel_pid = km.provisioner.process.pid
        stop_kernel(client, km)
    return kernel_pid


def outputs(cell, kind):
    return [o for o in cell.outputs if o.output_type == kind]


def result(cell):
    return outputs(cell, "execute_result")[-1]["data"]["text/plain"]


def test_a_notebook_session_on_persistent_ranks(tmp_path):
    markers = tmp_path / "markers"
    markers.mkdir()
    nb = make_notebook(
        SETUP.format(markers=str(markers)),
        "ranks = start_ranks(2, ui='text', interrupt_grace=5, use_port=free_port())",             # 1
        "ranks.run(build, args=(8,))",                                      # 2
        "first = ranks.run(train_epoch); second = ranks.run(train_epoch); (first, second)",  # 3
        "ranks.push(lr=0.05); ranks.run(set_lr)",                           # 4
        "ranks.pull('lr')",                                                 # 5
        "ranks.run(bad_batch)",                                             # 6: exception
        "pids = ranks.pids; ranks.run(evaluate_until_interrupted)",            # 7: interrupt
        "after = ranks.run(still_there); (after, [a[3] for a in after] == pids)",  # 8
        "ranks.run(crash)",                                                 # 9: a crash
        "ranks.run(build, args=(8,)); set(ranks.pids).isdisjoint(pids)",   # 10: restart
        "ranks.close(); [p.pid for p in psutil.Process().children(recursive=True) "
        "if p.status() != psutil.STATUS_ZOMBIE]",                           # 11
    )
    execute_with_interrupts(nb, str(tmp_path), str(markers))
    cells = nb.cells
    assert "notebook_launch: 2 ranks on notebook (CPU, gloo, fork, persistent)" in cell_text(cells[1])
    assert result(cells[2]) == "[0, 1]"
    first, second = eval(result(cells[3]))
    assert first[0] == first[1] and second[0] == second[1]    # DDP: the ranks agree
    assert second[0] < first[0]                               # the same model kept training
    assert result(cells[4]) == "[0.05, 0.05]"
    assert result(cells[5]) == "[0.05, 0.05]"

    error = outputs(cells[6], "error")[0]
    assert error.ename == "LaunchError"
    assert error.evalue.startswith("rank 1 failed: RuntimeError: shape mismatch in batch 3")
    assert "rank 0: interrupted after rank 1 failed (alive, state kept)" in error.evalue

    assert outputs(cells[7], "error")[0].ename == "KeyboardInterrupt"
    assert outputs(cells[8], "execute_result"), cell_text(cells[8])
    after, same_pids = eval(result(cells[8]))
    assert same_pids is True                                  # the interrupt left the ranks alive
    assert [a[:3] for a in after] == [("Sequential", True, True)] * 2   # model, flag, group: kept

    crash_error = outputs(cells[9], "error")[0]
    assert crash_error.ename == "LaunchError"
    assert crash_error.evalue.startswith("rank 0 failed: exit code 3")
    assert "The next call starts fresh ranks" in crash_error.evalue
    restart = cell_text(cells[10])
    assert "the ranks were restarted because rank 0 died (exit code 3)" in restart
    assert result(cells[10]) == "True"
    assert result(cells[11]) == "[]"


def test_the_ranks_magics(tmp_path):
    from helpers.nbutil import run_notebook
    nb = make_notebook(
        "%load_ext notebook_launch",
        "from notebook_launch.planning.net import free_port\n%ranks start -n 2 --ui text --port {free_port()}",
        "%%ranks\nimport torch.distributed as dist\ndist.init_process_group('gloo')\nx = dist.get_rank() * 10\n"
        "print('rank', dist.get_rank(), 'ready')",
        "offset = 5   # defined in the notebook after the start",
        "%%ranks\nprint('sum', x + offset, 'initialized', dist.is_initialized())",
        "%ranks pull x",
        "scale = 3\n%ranks push scale",
        "%%ranks\ny = x * scale",
        "%ranks pull y",
        "%%ranks\nif dist.get_rank() == 1:\n    raise KeyError('missing column')",
        "%ranks pull x",
        "%ranks status",
        "%ranks stop",
        "import psutil; [p.pid for p in psutil.Process().children(recursive=True) "
        "if p.status() != psutil.STATUS_ZOMBIE]",
    )
    run_notebook(nb, cwd=str(tmp_path), allow_errors=True)
    cells = nb.cells
    assert "persistent" in cell_text(cells[1])
    assert "[rank 0] rank 0 ready" in cell_text(cells[2]) and "[rank 1] rank 1 ready" in cell_text(cells[2])
    assert "[rank 1] sum 15 initialized True" in cell_text(cells[4])
    assert result(cells[5]) == "[0, 10]"
    assert result(cells[8]) == "[0, 30]"
    error = outputs(cells[9], "error")[0]
    assert error.ename == "LaunchError" and error.evalue.startswith("rank 1 failed: KeyError: 'missing column'")
    assert "raise KeyError('missing column')" in error.evalue     # the cell's own line, from the rank
    assert result(cells[10]) == "[0, 10]"                          # state kept after the exception
    assert "2 ranks alive" in cell_text(cells[11])
    assert result(cells[13]) == "[]"
    assert not outputs(cells[12], "error")


def test_kernel_shutdown_leaves_no_rank(tmp_path):
    from helpers.nbutil import run_notebook
    pid_file = tmp_path / "pids"
    nb = make_notebook("from notebook_launch import start_ranks\nranks = start_ranks(2, ui='none')\n"
                       f"open({str(pid_file)!r}, 'w').write(' '.join(map(str, ranks.pids)))")
    run_notebook(nb, cwd=str(tmp_path))
    pids = [int(p) for p in pid_file.read_text().split()]
    deadline = time.monotonic() + 10
    while any(psutil.pid_exists(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pids and not any(psutil.pid_exists(p) for p in pids)
    assert os.path.exists(pid_file)



def test_display_from_persistent_ranks_reaches_the_cell(tmp_path):
    """display() in ranks.run and in a %%ranks cell is relayed per call as for notebook_launcher:
    rank 0's by default, the ranks named by display_ranks / --display-ranks otherwise."""
    from helpers.nbutil import run_notebook
    messages: list[tuple[int, str, dict]] = []   # (cell index, msg_type, content) of each IOPub message
    nb = make_notebook(
        "%load_ext notebook_launch\n"
        "from IPython.display import HTML, display\n"
        "from notebook_launch import start_ranks\n"
        "from notebook_launch.planning.net import free_port\n"
        "def show(tag):\n"
        "    import os\n"
        "    display(HTML(f\"<b>{tag} from rank {os.environ['RANK']}</b>\"))\n"
        "    return os.environ['RANK']\n"
        "ranks = start_ranks(2, ui='text', use_port=free_port())",
        "ranks.run(show, args=('first call',))",
        "ranks.run(show, args=('second call',))",
        "ranks.close()\n%ranks start -n 2 --ui text --display-ranks 1 --port {free_port()}",
        "%%ranks\nimport os\ndisplay(HTML(f\"<i>cell from rank {os.environ['RANK']}</i>\"))",
        "%ranks stop",
    )
    run_notebook(nb, cwd=str(tmp_path), messages=messages)

    def html_of(index):
        return [c.get("data", {}).get("text/html", "") for i, kind, c in messages
                if i == index and kind == "display_data"]

    assert html_of(1) == ["<b>first call from rank 0</b>"]
    assert html_of(2) == ["<b>second call from rank 0</b>"], "each call relays its own display()"
    assert html_of(4) == ["<i>cell from rank 1</i>"]
    assert result(nb.cells[2]) == "['0', '1']"


def test_a_ranks_output_between_calls_reaches_the_running_cell(tmp_path):
    """A thread a call started prints after the call: its lines reach the rank's log and the
    cell that runs when they come (a plain cell, no ranks call), never a finished cell."""
    from helpers.nbutil import run_notebook
    markers = tmp_path / "markers"
    markers.mkdir()
    go, log_dir = markers / "go", tmp_path / "logs"
    nb = make_notebook(
        f"""
import os, threading, time
from notebook_launch import start_ranks
from notebook_launch.planning.net import free_port
ranks = start_ranks(2, ui="text", log_dir={str(log_dir)!r}, use_port=free_port())

def talk_later():
    def talk():
        while not os.path.exists({str(go)!r}):
            time.sleep(0.01)
        for i in range(2000):
            print(f"between calls {{i}} " + "." * 100)
        print("the last line between calls", flush=True)
    threading.Thread(target=talk, daemon=True).start()

ranks.run(talk_later)
""",
        f"""
open({str(go)!r}, "w").close()
logs = [os.path.join({str(log_dir)!r}, f"rank{{r}}.log") for r in range(2)]
while not all("the last line between calls" in open(log).read() for log in logs):
    time.sleep(0.05)
print("the cell saw the log")
""",
        "ranks.close()")
    run_notebook(nb, cwd=str(tmp_path))
    first, second, _ = (cell_text(c) for c in nb.cells)
    assert "between calls" not in first
    assert "[rank 1] the last line between calls" in second and "the cell saw the log" in second
    assert second.count("[rank 0] between calls ") == 2000
    assert open(log_dir / "rank0.log").read().count("between calls ") == 2000


def test_a_ranks_cell_names_the_notebook_values_it_cannot_send(tmp_path):
    """A %%ranks cell naming a notebook value that does not pickle says which and why before
    running; the ranks use their own value when they have one (here: their copy of the start)."""
    from helpers.nbutil import run_notebook
    nb = make_notebook(
        "%load_ext notebook_launch",
        "import threading\nearly = threading.Lock()   # before the start: the ranks have their copy\n"
        "from notebook_launch.planning.net import free_port\n%ranks start -n 2 --ui text --port {free_port()}",
        "lk = threading.Lock()   # after the start: only the notebook has it",
        "%%ranks\nwith lk:\n    print('ran')",
        "%%ranks\nwith early:\n    print('early ran')",
        "%ranks stop",
    )
    run_notebook(nb, cwd=str(tmp_path), allow_errors=True)
    cells = nb.cells
    text = cell_text(cells[3])
    assert "not sent to the ranks: lk (TypeError: cannot pickle '_thread.lock' object)" in text
    error = outputs(cells[3], "error")[0]
    assert "name 'lk' is not defined in this rank: the notebook's value could not be sent" in error.evalue
    assert not [line for line in text.splitlines() if line.endswith("] ran")], text   # the cell did not run
    assert "not sent to the ranks: early" in cell_text(cells[4])
    # both ranks printed it alike: one line names them (display.cell_budget)
    assert "[ranks 0-1] early ran" in cell_text(cells[4]) and not outputs(cells[4], "error")
