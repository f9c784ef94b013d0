"""Two real hosts on one machine: two network namespaces joined by a veth pair.

Each namespace has its own interfaces, addresses and ports, so the two
notebook_launcher calls talk over a real (virtual) link exactly as two
machines would, and nothing they send leaves the namespaces. Needs root and
iproute2 (`scripts/system-packages.sh` installs it); otherwise the tests skip
and say why.
"""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.netns_pair import create_pair, delete_pair, pair_names, unavailable_reason

REPO = Path(__file__).resolve().parents[2]
NODE_SCRIPT = Path(__file__).with_name("node_script.py")
PORT = 29400


def node_port() -> int:
    """The rendezvous port of this pytest worker's node pairs. Each namespace has its own ports, but
    every launch on this machine claims its port in one folder of /tmp (``net.PortReservation``),
    which the namespaces share: two pairs' node 0s on the same port, in two workers at once, would
    find it claimed. Two ports a worker (a test also uses ``port + 1``), one worker at a time."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return PORT + 2 * int(worker[2:] if worker[2:].isdigit() else 0)


class NodeProcess(subprocess.Popen):
    """One node's notebook_launcher call: its process, the JSON file its outcome goes to, and the log
    of what it printed."""
    output_path: Path
    log_path: str


class TwoNodes:
    """Namespaces A (node 0, 10.x.y.1) and B (node 1, 10.x.y.2)."""

    def __init__(self, tmp_path: Path):
        self.namespaces, self.links, self.addresses = pair_names("nl")
        self.tmp = tmp_path
        self.port = node_port()
        self.procs: list[NodeProcess] = []

    def create(self):
        create_pair(self.namespaces, self.links, self.addresses)

    def destroy(self):
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
        delete_pair(self.namespaces)

    def start(self, node_rank: int, scenario: str, **options) -> NodeProcess:
        """Start node ``node_rank``'s notebook_launcher call in its namespace."""
        out = self.tmp / f"node{node_rank}-{scenario}.json"
        cfg = {"node_rank": node_rank, "scenario": scenario, "master_addr": self.addresses[0],
               "port": self.port, "log_dir": str(self.tmp / f"logs-{scenario}-node{node_rank}"),
               "output": str(out), **options}
        cfg_path = self.tmp / f"node{node_rank}-{scenario}-config.json"
        cfg_path.write_text(json.dumps(cfg))
        stdout = open(self.tmp / f"node{node_rank}-{scenario}.out", "w")
        proc = NodeProcess(
            ["ip", "netns", "exec", self.namespaces[node_rank], sys.executable, str(NODE_SCRIPT),
             str(cfg_path)], cwd=REPO, stdout=stdout, stderr=subprocess.STDOUT, start_new_session=True)
        proc.output_path, proc.log_path = out, stdout.name
        self.procs.append(proc)
        return proc

    def finish(self, proc: NodeProcess, timeout: float = 90) -> dict:
        """Wait for a node's call to return; its JSON outcome plus what it printed."""
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            pytest.fail(f"node call did not return within {timeout} s:\n{Path(proc.log_path).read_text()}")
        printed = Path(proc.log_path).read_text()
        assert proc.returncode == 0 and proc.output_path.exists(), printed
        outcome = json.loads(proc.output_path.read_text())
        outcome["printed"] = printed
        return outcome

    def run(self, scenario, nodes=(0, 1), **options):
        procs = [self.start(n, scenario, **options) for n in nodes]
        return [self.finish(p) for p in procs]


@pytest.fixture
def two_nodes(tmp_path):
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    nodes = TwoNodes(tmp_path)
    try:
        nodes.create()
        yield nodes
    finally:
        nodes.destroy()
