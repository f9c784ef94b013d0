"""A real two-node Ray cluster on one machine, and a notebook that drives it
(tests/raycluster's fixtures and the Ray rows of benchmarks/run.py use it).

Two network namespaces joined by a veth pair are two hosts: each has only
loopback and its end of the link. `ray start --head` runs in the first,
`ray start --address` in the second, and the "notebook" is a real Jupyter
kernel in the first namespace (ZMQ over ipc:// files, since the tests' own
namespace cannot reach the namespaces' addresses). The tests use one cluster per
module; everything that ran in the namespaces is killed at the end, pass or fail.

Needs root and iproute2 (as tests/multinode); otherwise the tests skip and say why.
Resources are logical (--num-cpus), the object store small, the dashboard off and no
log monitor (every driver here, notebook_launch's own included, connects with
log_to_driver=False: it tailed the nodes' log files for no one, about 5% of a core per node),
so the cluster fits a 2-core machine.
"""
from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # tests/: netns_pair (also for benchmarks)
from helpers import netns_pair  # noqa: E402


REPO = Path(__file__).resolve().parents[2]
RAY = Path(sys.executable).with_name("ray")
# 2 logical CPUs per node: 4 ranks x 1 CPU then land 2 + 2 whatever Ray's SPREAD prefers, so the
# tests know which ranks share a node
CPUS_PER_NODE = 2
OBJECT_STORE_BYTES = 80 * 2**20
HEAD_PORT = 6379


def unavailable_reason() -> str | None:
    try:
        import ray  # noqa: F401
    except ImportError:
        return "needs ray (pip install -e '.[test]')"
    return netns_pair.unavailable_reason()


def kernel_manager(namespace: str, tmp: Path) -> Any:
    """A (not yet started) kernel in ``namespace``, reached over ipc:// files."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager
    root = Path(tempfile.mkdtemp(prefix="nlr-kernel-", dir=tmp))
    spec = root / "nlray"
    spec.mkdir()
    (spec / "kernel.json").write_text(json.dumps({
        "argv": ["ip", "netns", "exec", namespace, sys.executable, "-m", "ipykernel_launcher",
                 "-f", "{connection_file}"],
        "display_name": "notebook_launch on node A", "language": "python"}))
    return KernelManager(kernel_name="nlray", kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(root)]),
                         transport="ipc", ip=str(root / "zmq"))


class Notebook:
    """A Jupyter kernel in node A's namespace: cells run there as in a notebook."""

    def __init__(self, namespace: str, env: dict[str, str], tmp: Path) -> None:
        self.km = kernel_manager(namespace, tmp)
        self.km.start_kernel(env=env, cwd=str(tmp))
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=120)

    def submit(self, code: str) -> str:
        return self.kc.execute(code, store_history=False)

    def collect(self, msg_id: str, timeout: float) -> dict[str, Any]:
        """Everything the cell showed until it finished: stdout, stderr, the error if any."""
        out: dict[str, Any] = {"stdout": "", "stderr": "", "error": None, "displays": []}
        deadline = time.monotonic() + timeout
        while True:
            try:
                msg = self.kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"cell did not finish within {timeout} s; so far: {out}") from None
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                out[content["name"]] += content["text"]
            elif kind == "error":
                out["error"] = content
            elif kind in ("display_data", "update_display_data", "execute_result"):
                out["displays"].append(content)
            elif kind == "status" and content["execution_state"] == "idle":
                return out

    def run(self, code: str, timeout: float = 240) -> dict[str, Any]:
        return self.collect(self.submit(code), timeout)

    def value(self, code: str, timeout: float = 240) -> Any:
        """Run a cell whose last line prints one JSON document; return it."""
        out = self.run(code, timeout)
        if out["error"]:
            raise AssertionError(f"cell failed: {out['error']['ename']}: {out['error']['evalue']}\n"
                                 + "\n".join(out["error"]["traceback"]) + "\n" + out["stdout"] + out["stderr"])
        return json.loads(out["stdout"].strip().splitlines()[-1])

    def alive(self) -> bool:
        return bool(self.km.has_kernel and self.km.is_alive())

    def shutdown(self) -> None:
        try:
            self.kc.stop_channels()
        finally:
            if self.km.has_kernel:
                self.km.shutdown_kernel(now=True)


class RayTwoNodes:
    """Node A (head, and the notebook) and node B, each in its own namespace."""

    def __init__(self, tmp: Path, bind_gloo_in_node_env: bool = False, cpus_per_node: int = CPUS_PER_NODE) -> None:
        """``bind_gloo_in_node_env``: start each node with GLOO_SOCKET_IFNAME naming its link, as
        an administrator would for launchers that do not find the interface themselves."""
        self.bind_gloo_in_node_env = bind_gloo_in_node_env
        self.cpus_per_node = cpus_per_node
        self.cpu_seconds = 0.0   # of Ray's processes, as nodes are killed (_cpu_in)
        self.namespaces, self.links, self.addresses = netns_pair.pair_names("nlr")
        self.tmp = tmp
        self.temp_dir = f"/tmp/{self.namespaces[0]}"   # short: Ray's unix socket paths must fit 107 bytes
        self.env = dict(os.environ, PYTHONPATH=str(REPO), RAY_USAGE_STATS_ENABLED="0",
                        NOTEBOOK_LAUNCH_LOG_DIR=str(tmp / "runs"))
        self.env.pop("RAY_ADDRESS", None)
        self.notebook: Notebook | None = None

    @property
    def head(self) -> str:
        return f"{self.addresses[0]}:{HEAD_PORT}"

    def up(self) -> None:
        netns_pair.create_pair(self.namespaces, self.links, self.addresses)
        self.start_node(0, "--head", f"--node-ip-address={self.addresses[0]}", f"--port={HEAD_PORT}",
                        "--include-dashboard=false", f"--temp-dir={self.temp_dir}", *self._common())
        self._start_node_b(registration_awaited=True)
        self._start_notebook()
        self._await_node_b([], restarted=False)

    def _common(self) -> list[str]:
        return [f"--num-cpus={self.cpus_per_node}", f"--object-store-memory={OBJECT_STORE_BYTES}",
                "--disable-usage-stats", "--include-log-monitor=false"]

    def _start_node_b(self, registration_awaited: bool = False) -> None:
        self.start_node(1, f"--address={self.head}", f"--node-ip-address={self.addresses[1]}", *self._common(),
                        registration_awaited=registration_awaited)

    def _start_notebook(self) -> None:
        self.notebook = Notebook(self.namespaces[0], self.env, self.tmp)
        self.notebook.value("import json, ray\n"
                            f"ray.init(address={self.head!r}, log_to_driver=False)\n"
                            "print(json.dumps(len([n for n in ray.nodes() if n['Alive']])))")

    def ensure_up(self) -> None:
        """Both nodes and the notebook as ``up`` left them, for the next test module of a shared
        cluster: a test that ends by losing node B (the last of its module) leaves it down, and
        node B comes back as a new node (the dead one stays in Ray's list, as on a real cluster).
        Node A or the notebook gone: everything starts again."""
        if not self.pids(0) or self.notebook is None or not self.notebook.alive():
            self.down()
            self.up()
            return
        known = self.notebook.value("print(json.dumps([n['NodeID'] for n in ray.nodes()]))")
        restarted = not self.pids(1)
        if restarted:
            self._start_node_b(registration_awaited=True)
        self._await_node_b(known, restarted)

    def _await_node_b(self, known: list[str], restarted: bool) -> None:
        """Wait (at most 120 s) until node A and node B are the cluster's alive nodes; after a
        restart, a node B that was not in ``known``."""
        assert self.notebook is not None, "the notebook starts before the wait"
        # The lost node B stays Alive in Ray's list until the head's health checks give up on it
        # (seconds to tens of seconds): wait until the two alive nodes are node A and, after a
        # restart, a node B that was not there before. Counting alive nodes alone reads 3 while the
        # old one lingers beside the new one, or 2 (node A and the dead one) before the new one joins.
        alive = self.notebook.value(
            "import time\n"
            f"known, restarted = set({known!r}), {restarted!r}\n"
            "def settled(ids):\n"
            "    return len(ids) == 2 and (not restarted or bool(ids - known))\n"
            "deadline = time.monotonic() + 120\n"
            "ids = {n['NodeID'] for n in ray.nodes() if n['Alive']}\n"
            "while not settled(ids) and time.monotonic() < deadline:\n"
            "    time.sleep(0.2)\n"
            "    ids = {n['NodeID'] for n in ray.nodes() if n['Alive']}\n"
            "print(json.dumps([len(ids), settled(ids)]))")
        if alive != [2, True]:
            joined = "rejoin" if restarted else "join"
            raise RuntimeError(f"node B did not {joined} the cluster within 120 s: {alive[0]} node(s) alive"
                               + ("" if alive[1] else ", not node A and a new node B"))

    def start_node(self, node: int, *args: str, attempts: int = 5, registration_awaited: bool = False) -> None:
        """`ray start` on a node. Ray gives a raylet 30 s to register, which a loaded 2-core
        machine can miss: then everything of that node is killed and it starts again. With
        ``registration_awaited`` (the caller waits, bounded, for the node to join) a raylet that
        missed those 30 s but still runs is left to finish registering: `ray start` leaves it
        running when it gives up, and a new one, started beside the same load, missed them again
        five times in a row (the rest of tests/raycluster then failed at setup)."""
        for attempt in range(attempts):
            try:
                self.ray(node, "start", *args)
                return
            except RuntimeError as err:
                if registration_awaited and "timed out during startup" in str(err) and self.raylet_runs(node):
                    return
                if attempt == attempts - 1:
                    raise
                self.kill_node(node)
                if node == 0:
                    shutil.rmtree(self.temp_dir, ignore_errors=True)

    def ray(self, node: int, *args: str) -> str:
        env = dict(self.env, GLOO_SOCKET_IFNAME=self.links[node]) if self.bind_gloo_in_node_env else self.env
        result = subprocess.run(["ip", "netns", "exec", self.namespaces[node], str(RAY), *args], env=env,
                                capture_output=True, text=True, timeout=180)
        if result.returncode:
            raise RuntimeError(f"ray {' '.join(args)} failed on node {node}:\n{result.stdout}\n{result.stderr}")
        return result.stdout

    def pids(self, node: int | None = None) -> list[int]:
        nodes = range(2) if node is None else (node,)
        listed = (netns_pair.ip("netns", "pids", self.namespaces[n], check=False).stdout for n in nodes)
        return [int(pid) for text in listed for pid in text.split()]

    def raylet_runs(self, node: int) -> bool:
        """A raylet process is alive in the node's namespace."""
        for pid in self.pids(node):
            try:
                if b"raylet" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]:
                    return True
            except OSError:
                continue
        return False

    def rank_processes(self) -> list[str]:
        """Ray workers that still carry one of our rank actors (Ray names the process after it)."""
        found = []
        for pid in self.pids():
            try:
                title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if "RankActor" in title:
                found.append(f"{pid}: {title.strip()}")
        return found

    def kill_node(self, node: int | None) -> None:
        """SIGKILL every process in the node's namespace (both when None), until none is left."""
        self.cpu_seconds += self._cpu_in(node)
        for _ in range(100):   # raylets restart nothing once killed, but workers may be mid-fork
            pids = self.pids(node)
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)

    def _cpu_in(self, node: int | None) -> float:
        """CPU seconds of the processes in the node's namespace (both when None) and of the children
        they reaped: the raylet's ended workers (every Ray rank), the daemons, a notebook's kernel.
        Counted as a node is killed, for the run's summary (conftest): none of it is a descendant of
        pytest, so the run's own CPU count does not see it."""
        total = 0
        for pid in self.pids(node):
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += sum(int(f) for f in fields[11:15])   # utime, stime, cutime, cstime
        return total / os.sysconf("SC_CLK_TCK")

    def down(self) -> None:
        if self.notebook is not None:
            try:
                self.notebook.shutdown()
            except Exception as exc:   # the kernel may be gone already; its processes are killed below
                print(f"stopping the notebook kernel: {exc!r}", file=sys.stderr)
            self.notebook = None
        self.kill_node(None)
        netns_pair.delete_pair(self.namespaces)
        shutil.rmtree(self.temp_dir, ignore_errors=True)
