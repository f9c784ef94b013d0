"""The test kernels' ports (tests/helpers/kernel_ports.py): below the ephemeral range, a block per
process that no other live process draws from, each port checked free, and a real kernel listening
on them. Why: a kernel whose port another process took before it bound it died ("Address already
in use") and its test with it ("Kernel didn't respond in 60 seconds")."""
from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from helpers.kernel_ports import BLOCK, PORT_NAMES, REGION, block, ephemeral_range, kernel_ports, region
from helpers.nbutil import start_kernel

ROOT = Path(__file__).resolve().parent.parent

# A process that draws ports for four kernels, says them, and keeps its block until its stdin closes.
DRAW = """import json, sys
sys.path.insert(0, sys.argv[1])
from helpers.kernel_ports import block, kernel_ports
ports = [p for _ in range(4) for p in kernel_ports()]
print(json.dumps({"ports": ports, "block": [block().ports.start, block().ports.stop]}), flush=True)
sys.stdin.read()
"""


def test_no_port_drawn_is_in_the_ephemeral_range():
    ephemeral = ephemeral_range()
    assert region().stop <= ephemeral.start, (region(), ephemeral)
    ports = [port for _ in range(3) for port in kernel_ports()]
    assert len(set(ports)) == len(ports) == 3 * len(PORT_NAMES), ports
    assert all(port in REGION and port in block().ports and port not in ephemeral for port in ports), ports


def test_processes_drawing_at_once_never_draw_the_same_port():
    drawers = [subprocess.Popen([sys.executable, "-c", DRAW, str(ROOT / "tests")], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True) for _ in range(4)]
    try:
        drawn = [json.loads(drawer.stdout.readline()) for drawer in drawers if drawer.stdout is not None]   # all held
    finally:
        for drawer in drawers:
            drawer.communicate("", timeout=120)
    blocks = [range(*d["block"]) for d in drawn] + [block().ports]
    assert len({b.start for b in blocks}) == len(blocks), blocks
    assert all(len(b) == BLOCK and b.start in REGION and b.stop - 1 in REGION for b in blocks), blocks
    for d in drawn:
        assert all(port in range(*d["block"]) for port in d["ports"]), d
    every = [port for d in drawn for port in d["ports"]]
    assert len(set(every)) == len(every) == 4 * 4 * len(PORT_NAMES)


def test_a_port_someone_holds_is_never_given_out():
    mine = block()
    held = []
    try:
        for offset in range(3):   # the next three ports it would give, taken by "another process"
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            port = mine.ports[(mine.next + offset) % len(mine.ports)]
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:   # already held (a kernel of an earlier test): held all the same
                sock.close()
                continue
            sock.listen()
            held.append((sock, port))
        ports = kernel_ports()
        assert not {port for _, port in held} & set(ports), (held, ports)
    finally:
        for sock, _ in held:
            sock.close()


def test_a_test_kernel_listens_on_ports_of_the_block(tmp_path):
    km, kc = start_kernel(cwd=str(tmp_path))
    try:
        info = km.get_connection_info()
        ports = {info[name] for name in PORT_NAMES}
        assert len(ports) == len(PORT_NAMES) and ports <= set(block().ports), info
        kc.execute_interactive("print('alive')", timeout=120)
        kernel = psutil.Process(km.provisioner.process.pid)
        connections = getattr(kernel, "net_connections", None) or kernel.connections   # psutil < 6: connections
        listening = {c.laddr.port for c in connections("tcp") if c.status == psutil.CONN_LISTEN}
        assert ports <= listening, (ports, listening)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


@pytest.mark.parametrize("folder", ["notebook_launch", "tests", "benchmarks", "scripts", "notebooks", "examples"])
def test_nothing_else_picks_a_fixed_port_in_the_region(folder):
    """A fixed port of ours in the region (a test's use_port=, a rendezvous default) could be taken by a
    kernel, or take a kernel's, at any time: the region is the test kernels' alone."""
    number = re.compile(r"(?<![\w.])(\d{5})(?![\w.])")
    found = []
    for path in sorted((ROOT / folder).rglob("*")):
        if path.suffix not in (".py", ".sh", ".ipynb") or path.name == "kernel_ports.py":
            continue
        for line_number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if "port" in line.lower() and any(int(n) in REGION for n in number.findall(line)):
                found.append(f"{path.relative_to(ROOT)}:{line_number}: {line.strip()}")
    assert not found, "\n".join(found)
