"""What runs inside a rank once it is bootstrapped: reset what fork inherited, run the
user's function, and report its result or exception to the parent (``report_error``
is the one place a rank sends an ERROR)."""
from __future__ import annotations

import importlib
import logging
import os
import pickle
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

from ..wire import pickling, protocol, shared_tensors
from ..errors.best_effort import best_effort
from ..wire.plan import RankSpec
from . import installs, result_pickle
from .bootstrap import EXIT_FAILED, flush_everything

log = logging.getLogger("notebook_launch")


@dataclass
class Job:
    function: Callable[..., Any]
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)


def hook(entry: installs.Hook) -> Callable[[RankSpec], None]:
    """The rank hook ``entry`` names: its module's ``install``, imported now; or, for a best-effort
    one, a function that imports and installs it when the rank runs, under ``best_effort``."""
    if not entry.best_effort:
        return installs.named(entry.module, "install")

    def install(spec: RankSpec) -> None:
        with best_effort(entry.best_effort):
            installs.named(entry.module, "install")(spec)
    install.__qualname__ = f"{entry.module.rpartition('.')[2]}.install"
    return install


# Called with the RankSpec in every rank before the user's function runs (installs.RANK_HOOKS).
rank_hooks: list[Callable[[RankSpec], None]] = [hook(entry) for entry in installs.RANK_HOOKS]
importlib.import_module(installs.PROCESS_GROUPS)   # imported with the runner, as before the table: a fork shares it
# The result picklers' classes (cached by base), built here once: a forked rank finds them made; it
# built its own for its one result (0.1-0.2 ms of its CPU, a class and the pages it touches).
for _main_by_reference in (True, False):
    shared_tensors.pickler_class(result_pickle.pickler_base(_main_by_reference))


def flush_progress() -> None:
    """Send the bars' last counts before RESULT/ERROR, so the parent's final state is exact."""
    with best_effort("final progress flush failed"):
        installs.named(installs.PROGRESS, "flush")()


def reset_inherited_state() -> None:
    """Forget singletons the child inherited from the notebook (fork copies them)."""
    if "accelerate" in sys.modules:
        with best_effort("the inherited Accelerate state was not reset"):
            from accelerate.state import AcceleratorState, GradientState
            AcceleratorState._reset_state(True)
            GradientState._reset_state()


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
            module._IS_INTERACTIVE = False  # type: ignore[attr-defined]


def configure_torch(spec: RankSpec) -> None:
    torch = sys.modules.get("torch")
    if torch is None:
        return
    threads = os.environ.get("OMP_NUM_THREADS")
    if threads and threads.isdigit():
        torch.set_num_threads(int(threads))  # torch read OMP_NUM_THREADS when the parent imported it
    if spec.device.startswith("cuda"):
        torch.cuda.set_device(spec.local_rank)


def run_rank(spec: RankSpec, job: Job, *, forked_from_notebook: bool = False) -> int:
    """Run the user's function and report; return the process exit code.
    ``forked_from_notebook``: this process's ``__main__`` is a copy of the notebook's,
    so classes defined in cells travel back by reference (see ``result_pickle``)."""
    writer = protocol.current()
    assert writer is not None, "run_rank needs the event channel installed"
    steps: list[str] = []
    try:
        prepare_rank(spec, steps)
    except BaseException as exc:   # why: never an unexplained exit: say what failed and what to do
        report_error(setup_failure(spec, exc, steps[-1] if steps else "its set-up"), writer)
        return EXIT_FAILED
    writer.send(protocol.READY, {"pid": os.getpid(), "device": spec.device})
    code = call_and_report(spec, job, writer, forked_from_notebook=forked_from_notebook)
    if code == 0:
        # its gloo sockets close as it ends: not under a peer still joining
        installs.named(installs.PEERS_JOINED, "before_exit")()
    return code


def prepare_rank(spec: RankSpec, steps: list[str]) -> None:
    """Everything the rank does before the user's function: forget what fork inherited,
    configure torch (threads, this rank's GPU), install the rank hooks. ``steps`` gets the
    name of each step as it starts, so a failure can say which one failed."""
    steps.append("resetting the state fork inherited")
    reset_inherited_state()
    forget_interactive_session()
    steps.append(f"torch.cuda.set_device({spec.local_rank})" if spec.device.startswith("cuda")
                 else "configuring torch")
    configure_torch(spec)
    steps.append("process_groups.keep_groups_used_by_ddp()")
    # see process_groups: a gloo teardown deadlock
    installs.named(installs.PROCESS_GROUPS, "keep_groups_used_by_ddp")()
    for hook in rank_hooks:
        steps.append(f"the rank hook {getattr(hook, '__qualname__', hook)!s}")
        hook(spec)


POISONED_FORK_TEXT = "Cannot re-initialize CUDA in forked subprocess"


def setup_failure(spec: RankSpec, exc: BaseException, step: str) -> protocol.ErrorPayload:
    """The ERROR for a rank that failed before the user's function ran: a launcher error that
    says so, with the exception and advice (a CUDA that fork spoiled: how to avoid it)."""
    text = protocol.safe_str(exc)
    advice = "This is a notebook_launch failure, not your function's: please report it with the traceback."
    if POISONED_FORK_TEXT in text or "initialization error" in text:
        advice = ("The notebook's process had used the CUDA runtime before the launch (for example "
                  "torch.cuda.is_available() without PYTORCH_NVML_BASED_CUDA_CHECK=1, or a library that "
                  "initialized the CUDA driver), which no forked process survives. What to do: pass "
                  "start_method='spawn'; or restart the kernel, set "
                  "os.environ['PYTORCH_NVML_BASED_CUDA_CHECK'] = '1' first, and keep other CUDA calls "
                  "inside the launched function.")
    elif step.startswith("torch.cuda.set_device"):
        advice = (f"Check that {spec.device} exists and is free (nvidia-smi; CUDA_VISIBLE_DEVICES), "
                  f"or pass a smaller num_processes.")
    message = (f"notebook_launch could not prepare rank {spec.global_rank} before calling your function: "
               f"{step} raised {type(exc).__qualname__}: {text}\n{advice}")
    return protocol.error_payload(exc, message=message)


def call_and_report(spec: RankSpec, job: Job, writer: protocol.EventWriter, own_frames: int = 1, *,
                    forked_from_notebook: bool = False) -> int:
    """Call the user's function once and send its RESULT or ERROR; return the exit code
    that outcome means. A launched rank does this once; a persistent rank once per call.
    ``own_frames``: our frames above the user's code, left out of the traceback;
    ``forked_from_notebook``: as for ``run_rank``."""
    try:
        try:
            value = job.function(*job.args, **(job.kwargs or {}))
        finally:
            flush_progress()
            installs.named(installs.PROCESS_GROUPS, "release_destroyed_groups")()
    except SystemExit as exc:
        if exc.code in (None, 0):
            value = None
        else:
            report_error(protocol.error_payload(exc, skip_frames=own_frames), writer)
            return exc.code if isinstance(exc.code, int) else EXIT_FAILED
    except BaseException as exc:   # why: the user's function failed: reported as the rank's error
        report_error(protocol.error_payload(exc, skip_frames=own_frames), writer)
        return EXIT_FAILED
    try:
        # the result file is made only if a big part comes (``shared_tensors.Appender``)
        payload = serialize_result(value, writer.result_file, main_classes_by_reference=forked_from_notebook)
    except (OSError, MemoryError) as exc:   # the result file (out of memory, a memfd limit) or the stream
        report_error(result_memory_failure(spec, exc), writer)
        return EXIT_FAILED
    except Exception as exc:   # why: a result that cannot be sent is reported as the rank's error
        report_error(protocol.error_payload(
            exc, kind=protocol.FailureKind.RESULT, traceback="",
            message=unpicklable_result_message(spec, value, exc)), writer)
        return EXIT_FAILED
    flush_everything()   # the call's output reaches its pipes before its RESULT
    try:
        writer.send(protocol.RESULT, payload)
    except MemoryError as exc:   # a result that travels whole in its frame (no result file) is copied once more
        del payload
        report_error(result_memory_failure(spec, exc), writer)
        return EXIT_FAILED
    return 0


def result_memory_failure(spec: RankSpec, exc: BaseException) -> protocol.ErrorPayload:
    """The ERROR of a rank that ran out of memory (or of a memfd limit) sending its result: a
    result failure that says so, never a crash with our own traceback."""
    return protocol.error_payload(
        exc, kind=protocol.FailureKind.RESULT, traceback="",
        message=(f"rank {spec.global_rank} could not send its result: it ran out of memory writing it "
                 f"({type(exc).__name__}: {protocol.safe_str(exc) or 'no memory left'}). Free memory on the "
                 f"machine, or return less (for example only rank 0's state_dict)."))


def unpicklable_result_message(spec: RankSpec, value: Any, exc: Exception) -> str:
    """Which part of the returned value cannot be sent (its path: ``result["model"].layers[2].lock``)
    and why, so the user knows what to leave out or convert."""
    found = None
    # locating is a courtesy: the error is sent with or without it
    with best_effort("could not locate the unpicklable part of a result"):
        found = pickling.locate(value, "result")
    if found is None:
        path, part, error = "result", value, exc
    else:
        path, part, error = found
    kind = f"{type(value).__module__}.{type(value).__qualname__}"
    where = "" if path == "result" else f": {path} ({type(part).__module__}.{type(part).__qualname__}) cannot"
    return (f"rank {spec.global_rank} returned a value of type {kind} that cannot be pickled{where} "
            f"({type(error).__name__}: {error}). Return that part in a form that pickles (plain data, "
            f"tensors, a state_dict()), or leave it out.")


def report_error(payload: protocol.ErrorPayload, writer: protocol.EventWriter | None = None) -> None:
    """Send an ERROR to the parent: the one way a rank reports a failure.
    Output is flushed first, so the rank's log ends with what it printed."""
    writer = writer or protocol.current()
    if writer is None:
        log.debug("no event channel: error not reported: %s", payload["message"])
        return
    flush_everything()
    writer.send(protocol.ERROR, payload)


_PLAIN = frozenset({int, float, complex, bool, type(None)})   # exact types: a subclass may pickle itself otherwise
_SHORT = frozenset({str, bytes})
SHORT = 1 << 16   # far below shared_tensors.BIG_WRITE: such a value never goes to the result file


def serialize_result(value: Any, tensors_fd: int | None | Callable[[], int | None] = None, *,
                     main_classes_by_reference: bool = False) -> bytes:
    """The RESULT payload: ``value`` pickled with cloudpickle (``__main__`` classes by reference
    when the rank is a fork of the notebook, see result_pickle); the bytes of its tensors and
    numpy arrays, and a big stream, go to ``tensors_fd`` (see shared_tensors).

    The value is pickled as it is, not rebuilt first: pickle's memo keeps what the rank shared
    shared (``[a, a]``, a list that holds itself) and every tensor, wherever it sits, reaches the
    CPU while pickled (CUDA storages are copied to the CPU, XLA tensors pickled as CPU copies).

    A plain value (None, the most common result, a bool, an int, a float, a complex, a short str
    or bytes, of exactly those types) is pickled by ``pickle`` itself: it holds no tensor, no
    class and nothing to name by reference, and its stream is the very one the pickler below
    would write. Building that pickler, its stream and its file for one scalar cost about 0.2 ms
    of a launched rank's CPU, most of it the notebook's pages it wrote to, copied after the fork,
    and a tenth of a persistent rank's CPU per trivial call (issue 45)."""
    kind = type(value)
    if kind in _PLAIN or (kind in _SHORT and len(value) <= SHORT):
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    return shared_tensors.dumps(value, tensors_fd, base=result_pickle.pickler_base(main_classes_by_reference))

