"""Start ranks as fresh Python processes. The function, its arguments and the
notebook's context (working directory, sys.path, torch flags and random
states) travel to every rank with cloudpickle, so a function, closure, lambda
or class defined in a notebook cell runs there (plain pickle cannot find
``__main__.train`` in a fresh process). Used where fork is unsafe: macOS, a
parent that already initialized CUDA, or when asked for.

Each rank runs ``notebook_launch.rank.spawn_entry``; its stdout and stderr are
the rank's pipes from the first byte, the events pipe is passed by number.

Where it can (Linux), a rank is not a fresh interpreter but a fork of the warm start process
(``engines.local.start_process``), which imported torch once and never touched an accelerator: the
same entry, the same payload, the same fds under the same numbers; the start process reaps it and
says how it ended (``StartedRank``). It starts in milliseconds instead of seconds. Where the start
process cannot serve, ranks start as fresh interpreters, as before.
"""
from __future__ import annotations

import logging
import os
import select
import signal
import subprocess
import sys
import tempfile
from typing import TYPE_CHECKING, Any, Sequence

from ...wire import shared_tensors
from ...rank import spawn_context
from ...channels import LOST, PidfdRank, RankPipes, RankProcess, WaitStatus, reap
from ...wire.fork_locks import no_fork_during_exec
from ...notebook.notebook_streams import ERR, OUT
from . import start_process
from ..base import Launcher, start_each
from .warm_imports import TRAINING_MODULES, looks_like_training

if TYPE_CHECKING:
    from ...wire.plan import LaunchPlan, RankSpec
    from ...rank.runner import Job

log = logging.getLogger("notebook_launch")
# the folder that holds the notebook_launch package: as many levels up as the module's name is deep
PACKAGE_ROOT = os.path.abspath(__file__).rsplit(os.sep, __name__.count(".") + 1)[0]

# Runs in the fresh interpreter: make this notebook_launch importable even when the
# notebook found it through a sys.path entry the child would not have yet.
BOOTSTRAP = ("import sys; sys.path.insert(0, sys.argv.pop(1)); "
             "from notebook_launch.rank.spawn_entry import main; main()")


class SpawnedRank(RankProcess):
    def __init__(self, local_rank: int, popen: subprocess.Popen, exit_fd: int | None = None) -> None:
        self.local_rank = local_rank
        self.popen = popen
        self.pid = popen.pid
        self._status: WaitStatus | None = None
        self._sentinel_is_pidfd = exit_fd is None
        if exit_fd is not None:       # no pidfd (macOS): a pipe only the child holds
            self.sentinel = exit_fd
        else:
            self.sentinel = os.pidfd_open(popen.pid)

    def poll(self) -> WaitStatus | None:
        """Not Popen.poll/wait: they take a status someone else reaped for an exit code 0."""
        if self._status is None:
            code = self.popen.returncode
            if code is not None:   # its Popen was asked and reaped it itself
                self._status = ("signal", -code) if code < 0 else ("exit", code)
                return self._status
            ended = reap(self.pid, self.sentinel if self._sentinel_is_pidfd else None)
            if ended is None:
                return None
            status, self.end_usage = ended
            self._status = status
            # Popen must not wait for it again (nor warn that it still runs): its returncode
            # says the same as the status, a signal as its negative number.
            self.popen.returncode = -status[1] if status[0] == "signal" else status[1]
        return self._status

    @property
    def reaped(self) -> bool:
        return self._status is not None or self.popen.returncode is not None

    def release(self) -> None:
        if self.sentinel is not None:
            try:
                os.close(self.sentinel)
            except OSError:
                pass  # the sentinel was ours alone; nothing else can hold its number
            self.sentinel = None


REPORT_WAIT = 0.1   # seconds a rank that ended waits for the start process's word on how, per poll


class StartedRank(PidfdRank):
    """A rank forked by the warm start process, its child: its pidfd says when it ended, the start
    process how (``StartProcess.ended``: the exit code or signal, its peak memory and CPU time)."""

    def __init__(self, local_rank: int, pid: int, pidfd: int, starter: "start_process.StartProcess") -> None:
        self.local_rank, self.pid, self.starter = local_rank, pid, starter
        self._status: WaitStatus | None = None
        self.sentinel: int | None = pidfd   # the start process's, passed on: valid even if it already ended

    def poll(self) -> WaitStatus | None:
        if self._status is not None:
            return self._status
        # Once its pidfd says it ended, the start process reaps it and reports within milliseconds.
        ended = self.starter.ended(self.pid, wait=REPORT_WAIT if self._gone() else 0.0)
        if ended is not None:
            self._status, self.end_usage = ended
        elif not self.starter.alive() and self._gone():
            # The start process died and took its ranks with it (PR_SET_PDEATHSIG): no one reaped
            # this one who could say how it ended.
            self._status = LOST
            self.end_note = (f"ended with the warm start process (pid {self.starter.pid}, "
                             f"{self.starter.describe_end() or 'gone'}), which its ranks die with")
        return self._status

    def _gone(self) -> bool:
        return self.sentinel is None or bool(select.select([self.sentinel], [], [], 0)[0])

    def released(self) -> None:
        self.starter.released()


def _payload_file(payload: bytes) -> int:
    """The pickled job in a file with no name, which every rank reads from its fd: nothing of it is
    ever in a folder, so nothing stays behind when the notebook is killed (a ``job.pkl`` in a shared
    temp folder outlived a SIGKILLed kernel, and it can hold secrets the function closes over)."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("notebook_launch-job", os.MFD_CLOEXEC)
    else:   # no memfd (macOS): a private temp file, unlinked at once
        fd, path = tempfile.mkstemp(prefix="notebook_launch-job-")
        os.unlink(path)
    try:
        view = memoryview(payload)
        while view:
            view = view[os.write(fd, view):]
    except BaseException:
        os.close(fd)
        raise
    return fd


class SpawnBackend(Launcher):
    name = "spawn"

    def start(self, plan: "LaunchPlan", job: "Job", channels: Sequence[RankPipes],
              extra_fds: Sequence[Sequence[int]] = ()) -> list[RankProcess]:
        """``extra_fds``: per local rank, more fds the rank inherits under the same numbers
        (persistent ranks: the rank's command socket and the interrupt slot's memfd)."""
        # The job's tensors go once into a memfd that every rank maps copy-on-write; the
        # parent lets go of it once the ranks hold it (it dies with its last holder).
        job_tensors = shared_tensors.create_file()
        try:
            job_file = _payload_file(spawn_context.build_payload(job, plan.ranks, job_tensors))
            try:
                # The job's files go to every rank under the same numbers: ``shared`` is what each inherits.
                shared = (job_file, job_tensors)
                waiting = start_process.enabled() and not _start_process_ready()
                if waiting:   # said in the rows: a first launch waits seconds for its imports
                    self.start_watch.phase("waiting for the warm start process to import torch")
                starter = _start_process()
                if waiting:
                    self.start_watch.phase("")
                args = {spec.local_rank: _entry_args(spec, channels[spec.local_rank], job_file, os.getpid(),
                                                     job_tensors) for spec in plan.ranks}
                envs = {spec.local_rank: _rank_env(spec) for spec in plan.ranks}
                forked = self._fork_from(starter, plan, channels, args, envs, shared, extra_fds, job)

                def start_one(spec: "RankSpec", pipes: RankPipes) -> RankProcess:
                    started = forked.pop(spec.local_rank, None)
                    if started is not None and starter is not None:
                        return StartedRank(spec.local_rank, *started, starter)
                    extra = tuple(extra_fds[spec.local_rank]) if extra_fds else ()
                    env = dict(os.environ, **envs[spec.local_rank])
                    return self._popen_rank(spec, pipes, args[spec.local_rank], env, shared, extra)

                try:
                    return start_each(plan, channels, start_one)
                except BaseException:
                    for pid, pidfd in forked.values():   # forked, never handed to start_each: ours to end
                        _kill(pid)
                        os.close(pidfd)
                    raise
            finally:   # the ranks hold their own copies of the fd
                os.close(job_file)
        finally:
            if job_tensors is not None:
                os.close(job_tensors)

    def _fork_from(self, starter: "start_process.StartProcess | None", plan: "LaunchPlan",
                   channels: Sequence[RankPipes], args: dict[int, list[str]], envs: dict[int, dict[str, str]],
                   shared: tuple[int | None, ...], extra_fds: Sequence[Sequence[int]],
                   job: "Job") -> dict[int, tuple[int, int]]:
        """Local rank -> (pid, pidfd) of the ranks the start process forked (all of them, usually;
        none without one; those it could not fork start as fresh Pythons)."""
        if starter is None:
            return {}
        OUT.flush()   # what the notebook printed shows before the ranks' lines (as start_each does)
        ERR.flush()
        requests = []
        for spec in plan.ranks:
            pipes = channels[spec.local_rank]
            fds = {1: pipes.stdout_w, 2: pipes.stderr_w}
            extra = tuple(extra_fds[spec.local_rank]) if extra_fds else ()
            fds.update((fd, fd) for fd in (pipes.events_w, pipes.answers_r, pipes.tensors, *shared, *extra)
                       if fd is not None)
            argv = args[spec.local_rank] + ["--forked-by", str(starter.pid)]
            requests.append(start_process.RankRequest(argv, envs[spec.local_rank], fds))
        try:
            pids = starter.fork_ranks(requests, _warm_list(job))
        except start_process.StartProcessUnavailable as exc:
            print(f"notebook_launch: the warm start process could not start the ranks ({exc}); "
                  f"each rank starts as a fresh Python (slower)", file=ERR)
            return {}
        return {spec.local_rank: pid for spec, pid in zip(plan.ranks, pids)}

    def _popen_rank(self, spec: "RankSpec", pipes: RankPipes, args: list[str], env: dict[str, str],
                    shared: tuple[int | None, ...], extra_fds: tuple[int, ...]) -> "SpawnedRank":
        """A fresh Python (``spawn_entry``): where the start process is off or could not serve."""
        exit_r = exit_w = None
        if not hasattr(os, "pidfd_open"):
            exit_r, exit_w = os.pipe()
            os.set_inheritable(exit_r, False)
        argv = [sys.executable, "-c", BOOTSTRAP, PACKAGE_ROOT, *args]
        if exit_w is not None:
            argv += ["--exit-fd", str(exit_w)]
        extra: dict[str, Any] = {"process_group": 0} if sys.version_info >= (3, 11) else {}
        try:
            with no_fork_during_exec:   # a rank forked meanwhile would hold Popen's error pipe (fork_locks)
                popen = subprocess.Popen(
                    argv, stdin=subprocess.DEVNULL, stdout=pipes.stdout_w, stderr=pipes.stderr_w,
                    pass_fds=tuple(fd for fd in (pipes.events_w, pipes.answers_r, exit_w, pipes.tensors, *shared)
                                   if fd is not None) + extra_fds,
                    env=env, close_fds=True, **extra)
        except BaseException:
            if exit_r is not None:
                os.close(exit_r)
            raise
        finally:
            if exit_w is not None:
                os.close(exit_w)
        return SpawnedRank(spec.local_rank, popen, exit_fd=exit_r)


def _warm_list(job: "Job") -> list[str]:
    """What the start process imports before it forks this launch's ranks (as the fork start
    imports it in the notebook): torch._dynamo and DDP's module when the function trains."""
    try:
        trains = looks_like_training(job.function)
    except Exception:   # why: an odd callable: its ranks import what they need
        log.debug("could not read the launched function's code", exc_info=True)
        return []
    return list(TRAINING_MODULES) if trains else []


def _start_process_ready() -> bool:
    """Whether the warm start process runs and finished its imports (a launch then waits for nothing)."""
    process = start_process.running()
    return process is not None and process.ready is not None


def _start_process() -> "start_process.StartProcess | None":
    """The warm start process, ready; None where it is off or cannot serve (fresh Pythons then)."""
    if not start_process.enabled():
        return None
    try:
        return start_process.current()
    except (start_process.StartProcessUnavailable, OSError) as exc:
        print(f"notebook_launch: the warm start process cannot start ranks ({exc}); "
              f"each rank starts as a fresh Python (slower)", file=ERR)
        return None


def _entry_args(spec: "RankSpec", pipes: RankPipes, job_file: int, parent_pid: int,
                job_tensors: int | None) -> list[str]:
    """``rank.spawn_entry``'s arguments for one rank (whichever way it starts)."""
    args = ["--payload-fd", str(job_file), "--local-rank", str(spec.local_rank),
            "--events-fd", str(pipes.events_w), "--parent-pid", str(parent_pid),
            "--events-parent-fd", str(pipes.events_r), "--answers-fd", str(pipes.answers_r)]
    for option, fd in (("--tensors-fd", pipes.tensors), ("--job-tensors-fd", job_tensors)):
        if fd is not None:
            args += [option, str(fd)]
    return args


def _rank_env(spec: "RankSpec") -> dict[str, str]:
    """What of a rank's environment is its own, over the notebook's."""
    env = dict(spec.env)
    env.setdefault("PYTHONUNBUFFERED", os.environ.get("PYTHONUNBUFFERED", "1"))
    return env


def _kill(pid: int) -> None:
    """End a rank the start process forked (it reaps it)."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        log.debug("rank process %d was already gone", pid)
