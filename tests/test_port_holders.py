"""A busy default port is replaced by a free one; the note says who holds it, and nothing where this notebook's
own runs do (issue 47, part 5: "port 29500 is busy; using port N instead" after nearly every run read like a
conflict when the port was our own previous run's). Real sockets, processes and claims; who counts as "ours" is
decided from the pid passed in (``own_pid``), so a process of this test can be seen as another's."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from notebook_launch import notebook_launcher, start_ranks
from notebook_launch.planning import port_holders
from notebook_launch.planning.net import PortReservation, claim_free_port, free_port
from notebook_launch.planning.options import _DefaultPort   # the default use_port's marker (a busy one is replaced)

LISTENER = ("import socket, sys, time; s = socket.socket(); s.bind(('', 0)); s.listen(); "
            "print(s.getsockname()[1], flush=True); time.sleep(600)")
SIBLING = "import time; print('up', flush=True); time.sleep(600)"
CLAIMER = ("import sys, time; from notebook_launch.planning.net import PortReservation; "
           "c = PortReservation.claim(int(sys.argv[1])); print(c is not None, flush=True); time.sleep(600)")


@contextmanager
def process(code: str, *args: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """A Python process running ``code``, with the first line it prints (each prints one)."""
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        yield proc, proc.stdout.readline().strip()
    finally:
        proc.kill()
        proc.wait()


def holders(port: int, own_pid: int) -> list[port_holders.Holder]:
    return port_holders.find_holders(port, PortReservation.path(port), own_pid)


def test_another_process_listening_is_named_with_its_command():
    """As seen from an unrelated process (a sibling: neither is the other's ancestor), the listener is another
    process's, named by pid and command line."""
    with process(LISTENER) as (listener, port), process(SIBLING) as (sibling, _):
        found = holders(int(port), sibling.pid)
        assert [(h.pid, h.ours) for h in found] == [(listener.pid, False)], found
        assert found[0].command.startswith(f"{sys.executable} -c import socket"), found
        said = port_holders.note(int(port), 40001, found, sibling.pid)
        assert said == f"port {port} is held by pid {listener.pid} ({found[0].command}); using port 40001 instead"


def test_a_holder_whose_command_spans_lines_is_named_on_one_line():
    """A `python -c` program of several lines (a notebook's helper, a test's script) once broke the note in
    two, and the line after it read as a rank's output."""
    program = "import socket, sys, time\ns = socket.socket(); s.bind(('', 0)); s.listen()\n" \
              "print(s.getsockname()[1], flush=True)\ntime.sleep(600)"
    with process(program) as (listener, port), process(SIBLING) as (sibling, _):
        found = holders(int(port), sibling.pid)
        assert [h.pid for h in found] == [listener.pid], found
        said = port_holders.note(int(port), 40001, found, sibling.pid)
        assert said is not None and "\n" not in said and "-c import socket, sys, time s = socket" in said, said


def test_a_port_our_own_child_holds_says_nothing(capsys):
    """A process this one started (as a run's ranks are) holds the port: the launch takes another one and
    says nothing about it."""
    with process(LISTENER) as (_, port):
        assert [h.ours for h in holders(int(port), os.getpid())] == [True]
        results = notebook_launcher(lambda: os.environ["MASTER_PORT"], num_processes=2, use_port=_DefaultPort(port))
    out = capsys.readouterr().out
    assert results[0] == results[1] != port
    assert f"port {port}" not in out and "is held by" not in out and "is busy" not in out, out


def test_this_notebooks_persistent_ranks_holding_the_port_say_nothing(capsys):
    """Persistent ranks keep their port (claimed by this process, the store in their rank 0) while they live:
    a launch beside them takes another port without calling that a conflict."""
    port = str(free_port())
    ranks = start_ranks(2, use_port=_DefaultPort(port), ui="text")
    try:
        assert ranks.run(lambda: os.environ["MASTER_PORT"]) == [port, port]
        capsys.readouterr()
        results = notebook_launcher(lambda: os.environ["MASTER_PORT"], num_processes=2, use_port=_DefaultPort(port))
    finally:
        ranks.close()
    out = capsys.readouterr().out
    assert results[0] == results[1] != port
    assert f"port {port}" not in out and "is held by" not in out and "is busy" not in out, out


def test_a_claim_of_another_launch_is_named_and_our_own_is_not():
    """The claim two launches race for (net.PortReservation's flock) is found in /proc/locks: another
    launch's is named (seen from a sibling process); the claim this process holds (its own run's) is ours."""
    port = free_port()
    with process(CLAIMER, str(port)) as (claimer, claimed), process(SIBLING) as (sibling, _):
        assert claimed == "True"
        found = holders(port, sibling.pid)
        assert [(h.pid, h.ours) for h in found] == [(claimer.pid, False)], found
        said = port_holders.note(port, 40001, found, sibling.pid)
        assert said is not None and said.startswith(f"port {port} is held by pid {claimer.pid} ("), said
    own = claim_free_port(port)
    assert own is not None
    try:
        found = holders(port, os.getpid())
        assert [(h.pid, h.ours) for h in found] == [(os.getpid(), True)], found
        assert port_holders.note(port, 40001, found, os.getpid()) is None
    finally:
        own.release()


def test_a_closed_connections_time_wait_is_no_ones():
    """The side that closes a connection first keeps it in TIME_WAIT for a minute, owned by no process: it
    neither stops a store's bind (SO_REUSEADDR) nor counts as a holder."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = server.accept()
        accepted.close()          # the server's side closes first: its socket (local port = port) waits
        client.recv(1)
        client.close()
    time.sleep(0.1)
    table = open("/proc/net/tcp").read()
    waiting = [line for line in table.splitlines()[1:] if line.split()[1].endswith(f":{port:04X}")]
    assert waiting and all(line.split()[3] == "06" for line in waiting), waiting   # 06: TIME_WAIT
    assert holders(port, os.getpid()) == []
    assert port_holders.socket_inodes(table, port) == set()


def test_a_holder_this_user_cannot_see_is_said_so():
    """A socket on the port whose process was not found (another user's, where /proc hides its fds)."""
    said = port_holders.note(29500, 41234, [port_holders.Holder(None)], os.getpid())
    assert said == "port 29500 is held by a process this user cannot see; using port 41234 instead"
    assert port_holders.note(29500, 41234, [], os.getpid()) is None
