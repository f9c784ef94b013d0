"""A real two-node SLURM cluster on one machine (tests/slurmcluster's fixture uses it).

Two network namespaces joined by a veth pair are two hosts (tests/helpers/netns_pair); each
daemon also gets its own UTS namespace, so its hostname is its node's name (slurmd finds its
node by hostname). One munged (its own key, socket and files in the tmp folder) serves both
nodes, which share the file system as a cluster's nodes share /home; slurmctld and the first
slurmd run in node0's namespace, the second slurmd in node1's. Every file of the cluster
(slurm.conf, cgroup.conf, state, spool, logs) is in the tmp folder and ``SLURM_CONF`` points
at it: nothing under /etc is touched. The notebook side of a test runs in node0's namespace,
as a notebook on a login node would. ``down`` ends every daemon by its pid and deletes the
namespaces, whatever happened.

Recipe: ../shared/SLURM_RECIPE.md (Debian's slurm-wlm 22.05 and munge; root; iproute2).
"""
from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # tests/: helpers.netns_pair
from helpers import netns_pair  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
NODES = ("node0", "node1")
CPUS_PER_NODE = 2
DAEMONS = {"munged": "/usr/sbin/munged", "slurmctld": "/usr/sbin/slurmctld", "slurmd": "/usr/sbin/slurmd"}
ENDED = {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL",
         "DEADLINE"}   # a job's states once SLURM holds nothing of it (COMPLETING: its processes are still ending)
UP_TIMEOUT = 120.0   # seconds for both nodes to be idle (a loaded 2-core machine is slow)
# Memory is a consumable resource, each job's limited to what it asked for (--mem, else
# DefMemPerCPU for each of its CPUs) and its steps killed above it, as on most clusters. There are
# no cgroups to enforce it here (task/none), so jobacct_gather's OverMemoryKill does, polling each
# second: srun then says "StepId=... exceeded memory limit (used > limit), being killed".
MEMORY_PER_NODE = 8000   # MB the nodes offer (the machine has more; slurmd refuses a node claiming more than it has)
MEMORY_PER_CPU = 2000    # MB a job gets per CPU when it does not say (ranks that import torch fit)
# Seconds without an answer from a node's slurmd before slurmctld marks it DOWN (and its jobs
# NODE_FAIL); it pings every SLURMD_TIMEOUT/3 seconds, and a ping of a dead node fails after up to
# MESSAGE_TIMEOUT (SLURM's round-trip limit for any RPC) and is retried: a killed node's job ends
# NODE_FAIL about SLURMD_TIMEOUT + 2 * MESSAGE_TIMEOUT seconds after (30 s with 10 and 10, 20 s with
# 10 and 5, measured here). Production clusters use minutes and 10 s; these are still far above what a
# loaded machine's slurmd and slurmctld take to answer. (A job's time limit is checked every 30 s
# whatever the configuration: slurmctld's PERIODIC_TIMEOUT.)
SLURMD_TIMEOUT = 10
MESSAGE_TIMEOUT = 5


def unavailable_reason() -> str | None:
    missing = [name for name, path in DAEMONS.items() if not os.access(path, os.X_OK)]
    missing += [name for name in ("srun", "sinfo", "squeue", "scancel", "unshare") if shutil.which(name) is None]
    if missing:
        return (f"needs SLURM and munge ({', '.join(missing)} missing): apt-get install slurm-wlm munge "
                f"(scripts/system-packages.sh does it)")
    return netns_pair.unavailable_reason()


def default_sigint() -> None:
    """In a child before it execs: SIGINT back to its default (see ``SlurmTwoNodes.notebook``)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class SlurmTwoNodes:
    """node0 (slurmctld, slurmd, and the notebook) and node1 (slurmd), each in its own namespace."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.namespaces, self.links, self.addresses = netns_pair.pair_names("nlslurm")
        self.conf = tmp / "slurm.conf"
        # munged runs as the munge user, who cannot enter pytest's 0700 tmp folders: its own folder in /tmp
        self.munge_dir = Path(tempfile.mkdtemp(prefix="nlslurm-munge-"))
        self.munge_socket = self.munge_dir / "munge.socket"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf), PYTHONPATH=str(REPO),
                        NOTEBOOK_LAUNCH_LOG_DIR=str(tmp / "runs"))
        for name in [k for k in self.env if k.startswith(("SLURM_", "SBATCH_", "SALLOC_", "SRUN_"))]:
            if name != "SLURM_CONF":
                del self.env[name]
        self.daemons: dict[str, subprocess.Popen] = {}
        self._namespaces_made = False

    # -- up ---------------------------------------------------------------------------------
    def up(self) -> None:
        netns_pair.create_pair(self.namespaces, self.links, self.addresses)
        self._namespaces_made = True
        self._write_configs()
        self._start_munged()
        self._start("slurmctld", 0, "/usr/sbin/slurmctld", "-D", "-f", str(self.conf))
        for node in (0, 1):
            self._start(f"slurmd-{node}", node, "/usr/sbin/slurmd", "-D", "-f", str(self.conf))
        self.wait_idle()

    def _write_configs(self) -> None:
        state, spool = self.tmp / "state", self.tmp / "spool"
        state.mkdir()
        spool.mkdir()
        nodes = "\n".join(f"NodeName={name} NodeAddr={addr} CPUs={CPUS_PER_NODE} RealMemory={MEMORY_PER_NODE} "
                          f"State=UNKNOWN"
                          for name, addr in zip(NODES, self.addresses))
        self.conf.write_text(f"""ClusterName=nltest
SlurmctldHost={NODES[0]}({self.addresses[0]})
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU={MEMORY_PER_CPU}
SlurmUser=root
SlurmdUser=root
ReturnToService=2
MpiDefault=none
MailProg=/bin/true
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=task=1
JobAcctGatherParams=OverMemoryKill
StateSaveLocation={state}
SlurmctldPidFile={self.tmp}/slurmctld.pid
SlurmctldLogFile={self.tmp}/slurmctld.log
SlurmdSpoolDir={spool}/%n
SlurmdPidFile={spool}/%n.pid
SlurmdLogFile={spool}/%n.log
SlurmctldTimeout=30
SlurmdTimeout={SLURMD_TIMEOUT}
MessageTimeout={MESSAGE_TIMEOUT}
InactiveLimit=0
KillWait=2
MinJobAge=2
SchedulerParameters=sched_interval=1
{nodes}
PreemptType=preempt/partition_prio
PreemptMode=CANCEL
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP PriorityTier=1
PartitionName=urgent Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=2
""")
        (self.tmp / "cgroup.conf").write_text(
            "CgroupPlugin=cgroup/v1\nCgroupAutomount=no\nCgroupMountpoint=/sys/fs/cgroup\n")

    def _start_munged(self) -> None:
        """Our own munged: its key, socket, pid and seed files in a folder of its own, run as munge
        (as Debian's service does; a direct child, so ``down`` reaps it): /etc/munge and /run/munge
        are left alone."""
        folder = self.munge_dir
        key = folder / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o400)
        user = pwd.getpwnam("munge")
        for path in (folder, key):
            os.chown(path, user.pw_uid, user.pw_gid)
        self._start("munged", None, DAEMONS["munged"], "-F", "--force",
                    f"--key-file={key}", f"--socket={self.munge_socket}", f"--pid-file={folder}/munged.pid",
                    f"--seed-file={folder}/munged.seed", f"--log-file={folder}/munged.log", user="munge")
        self._wait(lambda: self.munge_socket.exists(), "munged to open its socket", 30)

    def _start(self, name: str, node: int | None, *argv: str, user: str | None = None) -> None:
        if node is not None:   # its own network namespace and hostname
            argv = ("ip", "netns", "exec", self.namespaces[node], "unshare", "--uts", "sh", "-c",
                    f'hostname {NODES[node]} && exec "$@"', "sh", *argv)
        log = open(self.tmp / f"{name}.out", "wb")
        try:
            self.daemons[name] = subprocess.Popen(argv, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                                  stdin=subprocess.DEVNULL, start_new_session=True,
                                                  user=user, group=user)
        finally:
            log.close()

    def wait_idle(self, timeout: float = UP_TIMEOUT) -> None:
        """Until sinfo shows both nodes idle (a daemon that died says so, with its log)."""
        def idle() -> bool:
            for name, daemon in self.daemons.items():
                if daemon.poll() is not None:
                    raise RuntimeError(f"{name} ended (code {daemon.returncode}):\n{self.logs()}")
            out = self.run(0, "sinfo", "-h", "-N", "-o", "%N %t", check=False).stdout.splitlines()
            idle_nodes = {line.split()[0] for line in out if line.split()[1:] == ["idle"]}   # a line per partition
            return len(idle_nodes) == len(NODES)
        self._wait(idle, "both SLURM nodes to be idle", timeout)

    def _wait(self, condition: Callable[[], bool], what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out waiting for {what}:\n{self.logs()}")
            time.sleep(0.2)

    def logs(self) -> str:
        parts = []
        for path in sorted(self.tmp.glob("*.out")) + sorted(self.tmp.glob("*.log")) \
                + sorted((self.tmp / "spool").glob("*.log")):
            parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-3000:]}")
        return "\n".join(parts)

    # -- use --------------------------------------------------------------------------------
    def netns_argv(self, node: int, *argv: str) -> list[str]:
        return ["ip", "netns", "exec", self.namespaces[node], *argv]

    def run(self, node: int, *argv: str, check: bool = True, timeout: float = 120,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """A command on ``node`` (in its network namespace), with the cluster's SLURM_CONF."""
        result = subprocess.run(self.netns_argv(node, *argv), env=env or self.env, capture_output=True,
                                text=True, timeout=timeout)
        if check and result.returncode:
            raise RuntimeError(f"{' '.join(argv)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
        return result

    def notebook(self, code: str) -> subprocess.Popen:
        """The notebook side: a Python process on node0 (the login node here) running ``code``
        (from a file, so tracebacks show its lines), its output in pipes (text)."""
        script = Path(tempfile.mkstemp(prefix="notebook-", suffix=".py", dir=self.tmp)[1])
        script.write_text(code)
        # PYTHONFAULTHANDLER: a test that gives up on it can SIGABRT it and read every thread's stack.
        # SIGINT at its default, as a terminal's or a kernel's Python has it, whatever the test run
        # inherited: a command started in the background by a shell without job control (CI scripts,
        # nohup ... &) has SIGINT ignored, Python then keeps it ignored, and a test's Ctrl-C reached
        # nothing (start_ranks' wait for a pending job sets no handler of its own; a launch does)
        return subprocess.Popen(self.netns_argv(0, sys.executable, str(script)),
                                env={**self.env, "PYTHONFAULTHANDLER": "1"}, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=str(self.tmp),
                                preexec_fn=default_sigint)

    def kernel_manager(self) -> Any:
        """A (not yet started) Jupyter kernel on node0, reached over ipc:// files (the tests' own
        namespace cannot reach node0's loopback), as tests/raycluster's notebooks are."""
        from jupyter_client.kernelspec import KernelSpecManager
        from jupyter_client.manager import KernelManager
        root = Path(tempfile.mkdtemp(prefix="kernel-", dir=self.tmp))
        spec = root / "nlslurm"
        spec.mkdir()
        (spec / "kernel.json").write_text(json.dumps({
            "argv": self.netns_argv(0, sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"),
            "display_name": "notebook_launch on node0", "language": "python"}))
        return KernelManager(kernel_name="nlslurm", kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(root)]),
                             transport="ipc", ip=str(root / "zmq"))

    def jobs(self) -> list[str]:
        """Every job SLURM still lists (any state but the ended ones squeue keeps for MinJobAge)."""
        out = self.run(0, "squeue", "-h", "-o", "%i %T", check=False).stdout
        return [line for line in out.splitlines() if line.strip() and line.split()[-1] not in ENDED]

    def pids(self, node: int | None = None) -> list[int]:
        nodes = range(2) if node is None else (node,)
        listed = (netns_pair.ip("netns", "pids", self.namespaces[n], check=False).stdout for n in nodes)
        return [int(pid) for text in listed for pid in text.split()]

    def processes_with(self, needle: str) -> list[str]:
        """Processes on either node whose command line contains ``needle``."""
        found = []
        for pid in self.pids():
            try:
                title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if needle in title:
                found.append(f"{pid}: {title.strip()}")
        return found

    def kill_node(self, node: int) -> None:
        """A node failure: SIGKILL every process in the node's namespace (its slurmd, the job's
        slurmstepd and ranks), until none is left."""
        for _ in range(100):
            pids = self.pids(node)
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)
        self.daemons[f"slurmd-{node}"].wait(timeout=30)

    def ensure_up(self) -> None:
        """Every daemon running (a test that failed a node restarts its slurmd: ReturnToService=2
        takes it back), no job of an earlier test in the queue, both nodes idle."""
        for node in (0, 1):
            if self.daemons[f"slurmd-{node}"].poll() is not None:
                self._start(f"slurmd-{node}", node, "/usr/sbin/slurmd", "-D", "-f", str(self.conf))
        self.cancel_all()
        self.wait_idle()

    def cancel_all(self) -> None:
        """Between tests: no job of an earlier test holds the nodes."""
        self.run(0, "scancel", "--full", "-u", "root", check=False)
        self._wait(lambda: not self.jobs(), "every job to leave the queue", 60)

    # -- down -------------------------------------------------------------------------------
    def down(self) -> None:
        """End every daemon we started (by pid: its session), then anything still in the
        namespaces (a job's processes), then the namespaces themselves."""
        for daemon in reversed(list(self.daemons.values())):
            if daemon.poll() is None:
                try:
                    os.killpg(daemon.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for daemon in self.daemons.values():
            try:
                daemon.wait(timeout=10)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(daemon.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                daemon.wait(timeout=10)
        self.daemons.clear()
        if self._namespaces_made:
            for _ in range(100):
                pids = self.pids()
                if not pids:
                    break
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                time.sleep(0.1)
            netns_pair.delete_pair(self.namespaces)
            self._namespaces_made = False
        shutil.rmtree(self.munge_dir, ignore_errors=True)
