"""Every way of starting ranks goes through the one launcher interface
(``backends.base.Launcher.start(plan, job, channels) -> processes``), as Lightning Fabric's
launchers do: ``START_PATHS`` lists them all. Each local path is run for real here (fork,
spawn, elastic's attempts, persistent ranks) and the ranks' own pids must be those the
launcher's ``start`` returned; xla runs in the xla lane (tests/xla) and Ray on the two-node
cluster (tests/raycluster: test_max_restarts_restarts_every_rank and, for persistent ranks,
test_node_lost_between_calls_is_a_launch_error_and_the_next_call_restarts record their starts).
Statically, no module outside the launchers starts a rank process."""
from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest
from test_import_graph import defines_a_launcher

from notebook_launch import LaunchError, engines, notebook_launcher, start_ranks
from notebook_launch.scaffold import run
from notebook_launch.engines import launcher_for
from notebook_launch.engines.base import Launcher, StartFailed
from notebook_launch.engines.local.fork import ForkBackend
from notebook_launch.engines.ray.launch import RayLauncher
from notebook_launch.engines.local.spawn import SpawnBackend
from notebook_launch.engines.xla.launcher import XlaBackend
from notebook_launch.engines.slurm.launcher import SlurmLauncher

PACKAGE = Path(__file__).resolve().parents[1] / "notebook_launch"

# Every start path: what the user calls -> the launcher that starts its ranks -> where that is checked.
START_PATHS = {
    "fork": ("notebook_launcher(start_method='fork')", ForkBackend, "test_a_launch_starts_its_ranks_through_start"),
    "spawn": ("notebook_launcher(start_method='spawn')", SpawnBackend,
              "test_a_launch_starts_its_ranks_through_start"),
    "xla": ("notebook_launcher(start_method='xla')", XlaBackend, "tests/xla (PJRT on CPU)"),
    "elastic": ("notebook_launcher(max_restarts=1) or num_nodes > 1", ForkBackend,
                "test_every_elastic_attempt_starts_through_start"),
    "ray": ("notebook_launcher(cluster=RayCluster(...))", RayLauncher,
            "tests/raycluster test_max_restarts_restarts_every_rank"),
    "slurm": ("notebook_launcher(cluster=SlurmCluster(...))", SlurmLauncher,
              "tests/slurmcluster test_four_ranks_on_two_nodes_all_reduce_and_results"),
    "persistent": ("start_ranks(start_method='fork' or 'spawn')", ForkBackend,
                   "test_persistent_ranks_start_through_start"),
    "persistent ray": ("start_ranks(cluster=RayCluster(...))", RayLauncher,
                       "tests/raycluster test_node_lost_between_calls_is_a_launch_error_and_the_next_call_restarts"),
}

# Processes the package starts that are not ranks, and why they are allowed outside a launcher.
NOT_RANKS = {
    "notebook_launch.process.orphan_keeper": "the per-notebook keeper that ends what ranks leave behind",
    "notebook_launch.process.leftovers": "starts the keeper",
    "notebook_launch.diagnose.native_stacks": "py-spy, reading a hung rank's native stack",
    "notebook_launch.detect.platform": "nvidia-smi, for the GPUs' names",
    "notebook_launch.notebook.cuda_tracking": "a throwaway fork that probes whether a fork is poisoned",
    "notebook_launch.engines.xla.replicas": "xmp.spawn, inside the xla launcher's own child (backends.xla)",
    # the SLURM engine keeps its launcher in its own package: its srun steps start in SlurmLauncher.start
    "notebook_launch.engines.slurm.launcher": "SlurmLauncher (a launcher outside backends/): srun, a step per node",
    "notebook_launch.engines.slurm.allocation": "salloc and the watchdog: the job SlurmLauncher's steps run in",
    "notebook_launch.engines.slurm.scheduler": "scontrol, squeue and scancel: questions to the scheduler",
    "notebook_launch.engines.slurm.watchdog": "scancel, when the notebook that started a SLURM job died",
    # ranks, but on a SLURM node: the node's half of SlurmLauncher.start, whose srun step runs it
    "notebook_launch.engines.slurm.node_agent": "forks its node's ranks inside the srun step SlurmLauncher.start began",
    # the warm start process: forks the ranks SpawnBackend.start asks it for (engines.local.start_process)
    "notebook_launch.engines.local.start_server": "forks the ranks SpawnBackend.start asks the warm start process for",
    # the fork loop those two share (the start process and SLURM's node agent call it, nothing else)
    "notebook_launch.rank.forking": "the fork of rank.start_server and slurm.node_agent, written once",
}
# Start paths that do not go through the interface yet; each must leave this list once it does
# (none is left: persistent ranks on Ray start through RayLauncher.start, with persistent=True).
NOT_YET: dict[str, str] = {}
STARTS_A_PROCESS = {("os", "fork"), ("os", "forkpty"), ("os", "posix_spawn"), ("subprocess", "Popen"),
                    ("subprocess", "run"), ("xmp", "spawn"), ("multiprocessing", "Process")}


def test_every_start_path_has_a_launcher():
    for name, (_call, launcher, _where) in START_PATHS.items():
        assert issubclass(launcher, Launcher), name
        assert "start" in vars(launcher), f"{launcher.__name__} must implement start() itself"
    for method in ("fork", "spawn", "xla"):
        assert isinstance(launcher_for(method), START_PATHS[method][1])
    with pytest.raises(TypeError):
        Launcher()  # type: ignore[abstract]   # the interface itself starts nothing


def _process_starts(path: Path) -> list[str]:
    """Calls in ``path`` that start a process: os.fork(), subprocess.Popen(...), xmp.spawn(...),
    fork_from_clean_thread(...), fork_all_from_clean_thread(...), and Ray's ``<actor>.run.remote(...)``
    (a rank's run)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) \
                and (func.value.id, func.attr) in STARTS_A_PROCESS:
            found.append(f"{func.value.id}.{func.attr}")
        elif isinstance(func, ast.Name) and func.id in ("fork_from_clean_thread", "fork_all_from_clean_thread"):
            found.append(func.id)
        elif isinstance(func, ast.Attribute) and func.attr == "remote" and isinstance(func.value, ast.Attribute) \
                and func.value.attr == "run":
            found.append("<actor>.run.remote")
    return found


def test_no_module_outside_the_launchers_starts_a_rank():
    starters = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        calls = _process_starts(path)
        # a launcher: backends/, or a cluster engine's module that defines one (ray.launch)
        if calls and not module.startswith("notebook_launch.engines.local.") and not defines_a_launcher(path):
            starters[module] = calls
    assert "notebook_launch.engines.local.fork_thread" not in starters   # the scan sees the launchers' own calls
    unexpected = {m: calls for m, calls in starters.items() if m not in NOT_RANKS and m not in NOT_YET}
    assert not unexpected, f"these modules start processes outside a launcher: {unexpected}"
    done = [m for m in NOT_YET if m not in starters]
    assert not done, f"these go through the interface now: remove them from NOT_YET: {done}"


def test_the_scan_sees_the_launchers_own_starts():
    assert _process_starts(PACKAGE / "engines" / "local" / "spawn.py") == ["subprocess.Popen"]
    assert "fork_all_from_clean_thread" in _process_starts(PACKAGE / "engines" / "local" / "fork.py")
    assert _process_starts(PACKAGE / "engines" / "ray" / "launch.py") == ["<actor>.run.remote"]


@pytest.fixture
def recorded_starts(monkeypatch):
    """Every call of a launcher's start() (fork, spawn), with the pids it returned."""
    starts: list[tuple[str, list[int]]] = []
    for cls in (ForkBackend, SpawnBackend):
        real = cls.start

        def recording(self, plan, job, channels, *args, _real=real, **kwargs):
            processes = _real(self, plan, job, channels, *args, **kwargs)
            starts.append((self.name, [p.pid for p in processes]))
            return processes
        monkeypatch.setattr(cls, "start", recording)
    return starts


def own_pid() -> int:
    return os.getpid()


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_launch_starts_its_ranks_through_start(method, recorded_starts, tmp_path):
    pids = notebook_launcher(own_pid, num_processes=2, start_method=method, ui="none", log_dir=tmp_path,
                             timeout=240)
    assert recorded_starts == [(method, pids)]


def fail_once(marker: str) -> int:
    if os.environ["RANK"] == "1" and not os.path.exists(marker):
        open(marker, "w").close()
        raise RuntimeError("the first attempt fails")
    return os.getpid()


def test_every_elastic_attempt_starts_through_start(recorded_starts, tmp_path):
    pids = notebook_launcher(fail_once, args=(str(tmp_path / "failed"),), num_processes=2, max_restarts=1,
                             ui="none", log_dir=tmp_path / "logs", timeout=240)
    assert [name for name, _ in recorded_starts] == ["fork", "fork"]   # one start per attempt
    assert recorded_starts[-1][1] == pids


def test_persistent_ranks_start_through_start(recorded_starts):
    with start_ranks(2, ui="none") as ranks:
        pids = ranks.run(own_pid)
    assert recorded_starts == [("fork", pids)]


class ForkAfterAWaitStandIn(ForkBackend):
    """The fork launcher with a wait before it, as a cluster's start waits (Ray placing its gang, a
    scheduler's queue): a stand-in for that wait, which needs a cluster here (tests/raycluster has
    one: test_busy_cluster_waits_then_says_what_is_missing; tests/slurmcluster a queued job). It
    says what it waits for, announces it once (as SLURM's queued job is) and ticks its watch;
    ``press_stop`` ticks in, it presses Stop as the panel's button does; ``fail``: the wait ends in
    a failed start instead."""

    def __init__(self, press_stop: int | None = None, fail: str | None = None) -> None:
        self.press_stop, self.fail = press_stop, fail
        self.ticks = 0
        self.rows: list[list[str]] = []
        self.started = False

    def start(self, plan, job, channels):
        watch = self.start_watch
        assert isinstance(watch, run.PanelStartWatch)   # the run's panel watches every start
        watch.waiting_for("waiting for the stand-in queue")
        watch.announce("the stand-in queue holds the job; Stop cancels it")
        self.rows = [[text for _stream, text in rank.lines] for rank in watch.state.ranks]
        for _ in range(20):
            self.ticks += 1
            if self.ticks == self.press_stop:
                watch.state.stop_requested = True
            watch.tick()
        if self.fail:
            raise StartFailed(self.fail, rank=1)
        self.started = True
        return super().start(plan, job, channels)


@pytest.fixture
def waiting_launcher(monkeypatch):
    def use(launcher: ForkAfterAWaitStandIn) -> ForkAfterAWaitStandIn:
        monkeypatch.setattr(engines, "launcher_for", lambda _method: launcher)
        return launcher
    return use


def test_a_start_that_waits_shows_on_the_panel_and_runs_on(waiting_launcher, tmp_path, capsys):
    """The run's watch draws what a waiting start says (issue 31 item 6: launchers draw nothing):
    what it waits for in every rank's row, its news once in the cell."""
    launcher = waiting_launcher(ForkAfterAWaitStandIn())
    pids = notebook_launcher(own_pid, num_processes=2, start_method="fork", ui="none", log_dir=tmp_path, timeout=240)
    assert launcher.started and launcher.ticks == 20 and len(pids) == 2
    assert launcher.rows == [["waiting for the stand-in queue"]] * 2
    cell = capsys.readouterr().out.splitlines()
    assert cell.count("notebook_launch: the stand-in queue holds the job; Stop cancels it") == 1, cell


def test_stop_ends_a_start_that_waits(waiting_launcher, tmp_path):
    launcher = waiting_launcher(ForkAfterAWaitStandIn(press_stop=3))
    with pytest.raises(KeyboardInterrupt, match="Stop button"):
        notebook_launcher(own_pid, num_processes=2, start_method="fork", ui="none", log_dir=tmp_path, timeout=240)
    assert launcher.ticks == 3 and not launcher.started


def test_a_failed_start_is_the_runs_launch_error(waiting_launcher, tmp_path):
    """A launcher raises StartFailed (it has no run); the run makes it its LaunchError, with its
    log folder and a result slot per rank."""
    waiting_launcher(ForkAfterAWaitStandIn(fail="the stand-in queue refused rank 1"))
    with pytest.raises(LaunchError) as caught:
        notebook_launcher(own_pid, num_processes=2, start_method="fork", ui="none", log_dir=tmp_path, timeout=240)
    error = caught.value
    assert str(error) == "notebook_launch: the stand-in queue refused rank 1"
    assert (error.rank, error.kind, error.results) == (1, "rendezvous", [None, None])
    assert error.log_dir and str(tmp_path) in error.log_dir
