"""What runs inside a rank: environment, output capture, and reporting the
function's result or exception to the parent over the event channel."""
from __future__ import annotations

import ctypes
import faulthandler
import io
import os
import signal
import sys
import traceback
from dataclasses import dataclass, field

from . import channel, process_groups

PR_SET_PDEATHSIG = 1
EXIT_FAILED = 1


@dataclass
class Job:
    function: object
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)


# Called with the RankSpec in every rank before the user's function runs.
rank_hooks = []


def _install_tqdm_bridge(spec) -> None:
    try:
        from . import tqdm_bridge   # tqdm bars in a rank report to the panel
        tqdm_bridge.install(spec)
    except Exception:   # a tqdm we cannot patch still works, just as plain text
        pass


rank_hooks.append(_install_tqdm_bridge)


def flush_progress() -> None:
    """Send the bars' last counts before RESULT/ERROR, so the parent's final state is exact."""
    try:
        from .progress import flush   # (the package attribute `progress` is the class)
        flush()
    except Exception:
        pass


def exit_with(body) -> None:
    """Run ``body()`` as a rank process's whole life, then end the process with its
    exit code. Never returns: the child must never fall back into the parent's code."""
    code = EXIT_FAILED
    try:
        code = body()
    except BaseException:  # report anything, then exit with a failure code
        try:
            traceback.print_exc()
        except BaseException:
            pass
    finally:
        flush_everything()
        os._exit(code)


def run_forked_rank(spec, job, pipes, all_pipes, parent_pid):
    """Entry point of a forked child. Never returns."""
    def body():
        keep = set(pipes.child_ends())
        for other in all_pipes:   # RankPipes.close skips fds closed (and maybe reused) already
            for fd in other.parent_ends() + other.child_ends():
                if fd not in keep:
                    other.close(fd)
        detach_from_parent(parent_pid)
        capture_output(pipes.stdout_w, pipes.stderr_w)
        os.environ.update(spec.env)
        channel.install(channel.EventWriter(pipes.events_w))
        return run_rank(spec, job)

    exit_with(body)


def detach_from_parent(parent_pid: int) -> None:
    """Own process group (so teardown reaches what the rank starts, and a
    terminal's Ctrl-C goes through the parent), death with the parent, and
    default signal handlers instead of the notebook's."""
    os.setpgid(0, 0)
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(EXIT_FAILED)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for name in ("SIGTERM", "SIGHUP", "SIGQUIT", "SIGCHLD", "SIGPIPE", "SIGUSR1", "SIGUSR2"):
        signum = getattr(signal, name, None)
        if signum is not None:
            try:
                signal.signal(signum, signal.SIG_DFL)
            except (OSError, ValueError):
                pass


def capture_output(stdout_fd: int, stderr_fd: int) -> None:
    """Point fds 1 and 2 (C-level output too) and sys.stdout/stderr at the rank's pipes."""
    flush_everything()
    os.dup2(stdout_fd, 1)
    os.dup2(stderr_fd, 2)
    if stdout_fd not in (1, 2):
        os.close(stdout_fd)
    if stderr_fd not in (1, 2):
        os.close(stderr_fd)
    sys.stdout = sys.__stdout__ = _text_stream(1)
    sys.stderr = sys.__stderr__ = _text_stream(2)
    # A segfault or abort then prints the Python stack into the rank's log and error.
    faulthandler.enable(file=sys.stderr, all_threads=True)


def _text_stream(fd: int):
    raw = io.FileIO(fd, "w", closefd=False)
    return io.TextIOWrapper(io.BufferedWriter(raw), encoding="utf-8",
                            errors="backslashreplace", line_buffering=True, write_through=False)


def flush_everything() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    try:  # C stdio buffers, which os._exit would drop
        ctypes.CDLL(None).fflush(None)
    except Exception:
        pass


def reset_inherited_state() -> None:
    """Forget singletons the child inherited from the notebook (fork copies them)."""
    if "accelerate" in sys.modules:
        try:
            from accelerate.state import AcceleratorState, GradientState
            AcceleratorState._reset_state(True)
            GradientState._reset_state()
        except Exception:
            pass


def forget_interactive_session() -> None:
    """A rank is not an interactive session, though fork copied the notebook's ``sys.ps1``.
    Lightning reads it (``_IS_INTERACTIVE``, at import) to choose ``ddp_fork`` and start
    processes of its own; without the prompt it joins the launched ranks instead."""
    for name in ("ps1", "ps2", "ps3"):
        if hasattr(sys, name):
            delattr(sys, name)
    for module_name in ("lightning.fabric.utilities.imports", "lightning.fabric.connector",
                        "lightning_fabric.utilities.imports", "lightning_fabric.connector",
                        "lightning.pytorch.trainer.connectors.accelerator_connector",
                        "pytorch_lightning.trainer.connectors.accelerator_connector"):
        module = sys.modules.get(module_name)
        if module is not None and getattr(module, "_IS_INTERACTIVE", False):
            module._IS_INTERACTIVE = False


def configure_torch(spec) -> None:
    torch = sys.modules.get("torch")
    if torch is None:
        return
    threads = os.environ.get("OMP_NUM_THREADS")
    if threads and threads.isdigit():
        torch.set_num_threads(int(threads))  # torch read OMP_NUM_THREADS when the parent imported it
    if spec.device.startswith("cuda"):
        torch.cuda.set_device(spec.local_rank)


def run_rank(spec, job) -> int:
    """Run the user's function and report; return the process exit code."""
    writer = channel.current()
    reset_inherited_state()
    forget_interactive_session()
    configure_torch(spec)
    process_groups.keep_groups_used_by_ddp()   # see process_groups: a gloo teardown deadlock
    for hook in rank_hooks:
        hook(spec)
    writer.send(channel.READY, {"pid": os.getpid(), "device": spec.device})
    try:
        try:
            value = job.function(*job.args, **(job.kwargs or {}))
        finally:
            flush_progress()
            process_groups.release_destroyed_groups()
    except SystemExit as exc:
        if exc.code in (None, 0):
            value = None
        else:
            report_exception(writer, exc)
            return exc.code if isinstance(exc.code, int) else EXIT_FAILED
    except BaseException as exc:
        report_exception(writer, exc)
        return EXIT_FAILED
    try:
        payload = serialize_result(value)
    except Exception as exc:
        writer.send(channel.ERROR, {
            "kind": "result", "type": type(exc).__name__,
            "message": (f"rank {spec.global_rank} returned a value of type "
                        f"{type(value).__module__}.{type(value).__qualname__} that cannot be pickled "
                        f"({type(exc).__name__}: {exc}). Return plain data instead: numbers, strings, "
                        f"lists, dicts, tensors or a state_dict()."),
            "traceback": "",
        })
        return EXIT_FAILED
    writer.send(channel.RESULT, payload)
    return 0


def report_exception(writer, exc: BaseException) -> None:
    flush_everything()
    writer.send(channel.ERROR, {
        "kind": "exception",
        "type": type(exc).__qualname__,
        "message": str(exc),
        # Start at the user's frame: the worker's own frame is noise.
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__.tb_next
                                                        or exc.__traceback__)),
    })


def serialize_result(value) -> bytes:
    import cloudpickle
    return cloudpickle.dumps(to_cpu(value))


def to_cpu(value):
    """Move tensors (also inside lists, tuples and dicts) to the CPU, so the
    parent, which must not initialize CUDA, can unpickle them."""
    torch = sys.modules.get("torch")
    if torch is None:
        return value
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if type(value) is dict:
        return {k: to_cpu(v) for k, v in value.items()}
    if isinstance(value, dict):  # OrderedDict (a state_dict), defaultdict, ...
        return _rebuild_mapping(value)
    if isinstance(value, list):
        return [to_cpu(v) for v in value]
    if isinstance(value, tuple):
        items = [to_cpu(v) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    return value


def _rebuild_mapping(value):
    try:
        copy = type(value)()
        for k, v in value.items():
            copy[k] = to_cpu(v)
        return copy
    except Exception:
        return value
