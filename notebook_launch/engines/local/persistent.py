"""Persistent ranks on this machine, forked or spawned: the ``transport.RankTransport`` of
``start_ranks()`` without a cluster.

The ranks start through the same preparation, plan, launcher and bootstrap as a launch
(``prepare.plan_launch``, given by ``engines``; this folder's launchers): the launcher's channels,
plus per rank a command socket (frames, and memfds beside them for tensors, both ways) and one ``InterruptSlot`` in
shared memory for all. A spawned rank inherits only what it is passed: its command socket and
the slot's memfd go to ``SpawnBackend.start`` as ``extra_fds``. A rank that ends has its
process group ended at once (while it is an unreaped zombie its pid is still its group's id),
and what left the group is swept when the ranks stop (``leftovers``).
"""
from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ...process import leftovers
from . import get_backend
from ...errors import LaunchArgumentError
from ...record.line_prefix import parse_line_prefix
from ...planning.net import release_claims
from ...planning.options import LaunchOptions, check_display_ranks_exist
from ...channels import commands
from ...channels.interrupt_slot import InterruptSlot
from ...rank.runner import Job
from ...rank.serve import serve_calls
from ...scaffold.session import launch_line
from ...supervise import outcome
from ...record.proc_usage import KeptProcFiles
from ...supervise.kernel_oom import OomBaseline, sigkill_words
from ...persistent import command_frames
from ...persistent.transport import STOP_GRACE, LogsFor, LostBetweenCalls, RankTransport, ended, exited, wait_for_ends
from ...supervise.resources import SAMPLE_EVERY

if TYPE_CHECKING:
    from ...channels import RankPipes, RankProcess, WaitStatus
    from ...record.logs import RunLogs
    from ...wire.plan import LaunchPlan
    from ...planning.target import LaunchTarget

log = logging.getLogger("notebook_launch")
PlanLaunch = Callable[[LaunchOptions], "tuple[LaunchTarget, LaunchPlan, str]"]   # options -> target, plan, run id


class LocalTransport(RankTransport):
    """Ranks forked or spawned here, reached over their command sockets (see the module)."""

    def __init__(self, options: LaunchOptions, plan_launch: PlanLaunch) -> None:
        """``plan_launch``: ``prepare.plan_launch``, the one planning every launch of this machine
        goes through (given by the engine's chooser, which sits above both)."""
        super().__init__()
        self.options = options
        self.plan_launch = plan_launch
        self.backend_name = "fork, persistent"
        self.platform: str | None = None
        self._commands: list[commands.CommandPipe] = []
        self._run_mark = ""                # NOTEBOOK_LAUNCH_RUN_ID of the current ranks (leftovers.sweep)
        self._reaping = threading.Lock()   # a rank's group is ended before it is reaped, by one thread
        self._idle_oom: OomBaseline | None = None   # the kernel's OOM counts as the ranks last went idle
        self._idle_pids: set[int] = set()           # the ranks _idle_oom saw
        self._cgroup_files = KeptProcFiles()        # the ranks' /proc/PID/cgroup, read as they go idle

    def start(self, logs_for: LogsFor) -> LaunchPlan:
        target, plan, run_id = self.plan_launch(self.options)
        try:
            self._start_planned(target, plan, run_id, logs_for)
        except BaseException:
            release_claims(run_id)   # the port plan_launch claimed: no rank holds it
            raise
        return plan

    def _start_planned(self, target: LaunchTarget, plan: LaunchPlan, run_id: str, logs_for: LogsFor) -> None:
        if plan.start_method not in ("fork", "spawn"):
            raise LaunchArgumentError(
                f"persistent ranks are forked or spawned, but this machine launches with "
                f"{plan.start_method!r}; use notebook_launcher here")
        check_display_ranks_exist(self.options.display_ranks, plan.world_size)
        self.backend_name, self.platform = f"{plan.start_method}, persistent", target.where.platform
        backend = get_backend(plan.start_method)
        backend.prepare_parent()
        logs_for(plan, run_id)
        pipes = backend.open_channels(plan)
        command_pipes: list[commands.CommandPipe] = []
        slot: InterruptSlot | None = None
        try:
            command_pipes.extend(commands.CommandPipe.open() for _ in plan.ranks)
            slot = InterruptSlot(len(plan.ranks))
            spawned = plan.start_method == "spawn"
            job = Job(serve_calls, (plan, command_pipes, slot), {"spawned": spawned})
            if spawned:   # a fresh interpreter inherits only what it is passed
                from .spawn import SpawnBackend   # (get_backend imported it: spawn's launcher)
                assert isinstance(backend, SpawnBackend) and slot.fd is not None
                processes = backend.start(plan, job, pipes, extra_fds=[(c.read_fd, slot.fd) for c in command_pipes])
            else:
                processes = backend.start(plan, job, pipes)
            self.processes[:] = processes   # at once: an interrupt from here on finds them (``Ranks._start``)
        except BaseException:
            for p in pipes:
                p.close_all()
            for c in command_pipes:
                c.close_write_end()
            if slot is not None:
                slot.close()
            raise
        finally:
            for c in command_pipes:
                c.close_read_end()
        self.pipes, self._commands, self.interrupts = pipes, command_pipes, slot
        self.result_fds = [c.write_fd for c in command_pipes]
        self._run_mark = run_id

    def launch_line(self, plan: LaunchPlan, logs: RunLogs, display: str) -> str:
        return launch_line(plan, self.backend_name, logs, display=display, platform=self.platform)

    def send(self, frame: commands.Frame) -> None:
        for pipe in self._commands:
            try:
                commands.send(pipe.write_fd, frame)
            except BrokenPipeError:   # that rank is gone: the supervisor sees its exit
                log.debug("rank command pipe %d is broken", pipe.write_fd)

    def tag(self, plan: LaunchPlan, template: str | None) -> Callable[[int], str]:
        prefix, specs = parse_line_prefix(template), plan.ranks
        return lambda local: prefix.render(rank=specs[local].global_rank, local_rank=local)

    def on_exit(self, process: RankProcess) -> None:
        with self._reaping:
            if not process.reaped:
                leftovers.end_rank_group(process.pid)

    def idle_begins(self) -> None:
        """The kernel's OOM counts and each live rank's memory cgroup now: a rank SIGKILLed before
        the next call is said as the OOM killer's only where the kernel counted it since. Read
        again only once the last read is SAMPLE_EVERY old (or the ranks changed): calls a
        millisecond apart read /proc/vmstat and every rank's cgroup once a second, not per call
        (issue 45); the kernel log, which verdict() reads first, names the killed pid either way."""
        pids = {p.pid for p in self.processes} - {p.pid for p in ended(self.processes)}
        last = self._idle_oom
        if last is not None and pids == self._idle_pids and time.monotonic() - last.started < SAMPLE_EVERY:
            for pid in pids:   # a rank may have moved to another cgroup during the call (one small read each)
                last.see_process(pid)
            return
        if pids != self._idle_pids:
            self._cgroup_files.keep_only({f"/proc/{pid}/cgroup" for pid in pids})
        self._idle_oom = OomBaseline(pids, during="since the ranks last went idle", read=self._cgroup_files.read)
        self._idle_pids = pids

    def lost_between_calls(self, gone: list[RankProcess], logs: RunLogs, num_processes: int) -> LostBetweenCalls:
        """The first rank found ended: the next call runs on fresh ranks (saying so), a SIGKILL in
        the words of the kernel's records (``kernel_oom``), as a death during a call is."""
        status = end_and_reap(gone[0], self._reaping)
        how = outcome.describe_status(status)
        if status == ("signal", signal.SIGKILL) and self._idle_oom is not None:
            how = sigkill_words(self._idle_oom.verdict(gone[0].pid))
        return LostBetweenCalls(f"local rank {gone[0].local_rank} ended between calls ({how})")

    def stop(self, graceful: bool, before_kill: Callable[[], object]) -> None:
        stop_processes(self.processes, self.pipes, self._commands, graceful, self._reaping,
                       before_kill=before_kill, run_mark=self._run_mark)
        release_claims(self._run_mark)   # the ranks' port, claimed by plan_launch, is free for other launches
        self.processes[:] = []
        self.pipes, self._commands, self.result_fds = [], [], []
        self._cgroup_files.close()
        if self.interrupts is not None:
            self.interrupts.close()
            self.interrupts = None

    def abandon(self) -> None:
        kill_all(self.processes, self._reaping)
        self._cgroup_files.close()


def stop_processes(processes: list[RankProcess], pipes: list[RankPipes], command_pipes: list[commands.CommandPipe],
                   graceful: bool, reaping: threading.Lock, before_kill: Callable[[], object] = lambda: None,
                   run_mark: str = "") -> None:
    """Ask each rank to end between calls (STOP, then end of file on its command pipe), give
    ``graceful`` ranks STOP_GRACE seconds, SIGKILL the rest with their process groups, sweep
    what left a group (``run_mark``: the ranks' NOTEBOOK_LAUNCH_RUN_ID), and close the pool's fds."""
    if graceful:
        try:
            frame = command_frames.encode(commands.Command.STOP, None)
            for pipe in command_pipes:
                try:
                    commands.send(pipe.write_fd, frame)
                except OSError:
                    log.debug("STOP not delivered to fd %d", pipe.write_fd)
            frame.close()
        except Exception:   # why: STOP is a courtesy; closing the pipes below ends the ranks' loops anyway
            log.debug("STOP could not be encoded", exc_info=True)
    for pipe in command_pipes:
        pipe.close_write_end()   # end of file: a rank between calls ends its loop
    wait_for_ends(processes, STOP_GRACE if graceful else 0.0)   # exited, not reaped: its group is ended first
    before_kill()
    kill_all(processes, reaping)
    if run_mark and processes:
        leftovers.sweep(run_mark)   # what a rank started that left its process group
    for rank_pipes in pipes:
        rank_pipes.close_parent_ends()
        rank_pipes.close_child_ends()


def kill_all(processes: list[RankProcess], reaping: threading.Lock) -> None:
    """SIGKILL what is left of ``processes`` and their process groups, and reap them (also the
    pool's finalizer)."""
    for process in processes:
        end_and_reap(process, reaping)
        process.release()


def end_and_reap(process: RankProcess, reaping: threading.Lock) -> WaitStatus:
    """SIGKILL the rank and its process group (what it started: a subprocess, DataLoader
    workers), then reap it: alive or a zombie, its pid is still its group's id."""
    with reaping:
        if not process.reaped:
            process.kill()   # killpg, then the pid itself
        return process.wait()


__all__ = ["LocalTransport", "exited"]

