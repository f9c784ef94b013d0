"""notebook_launcher: options -> preflight -> target -> plan (``prepare``) -> run scaffold -> launcher.start ->
supervisor -> results."""
from __future__ import annotations

import os
import dataclasses
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

from .planning import preflight
from .errors import LaunchError, NotebookLaunchError, user_interrupt
from .display.cell_budget import DEFAULT_CELL_OUTPUT
from .engines import engine_for
from .planning.options import DEFAULT_LINES_PER_SECOND, DEFAULT_USE_PORT, LaunchOptions
from .wire.plan import StartMethod
from .planning.prepare import entry_options
from .diagnose.stall import DEFAULT_STALL_AFTER

if TYPE_CHECKING:
    from .display.base import Display
    from .engines.ray.cluster import RayCluster
    from .engines.slurm.cluster import SlurmCluster


def notebook_launcher(function: Callable[..., Any], args: tuple | list = (), num_processes: int | None = None,
                      mixed_precision: str = "no", use_port: int | str = DEFAULT_USE_PORT,
                      master_addr: str = "127.0.0.1", node_rank: int = 0, num_nodes: int = 1,
                      rdzv_backend: str = "static", rdzv_endpoint: str = "",
                      rdzv_conf: Mapping[str, Any] | None = None, rdzv_id: str = "none",
                      max_restarts: int = 0, monitor_interval: float = 0.1,
                      log_line_prefix_template: str | None = None, *, kwargs: dict[str, Any] | None = None,
                      start_method: StartMethod | None = None, timeout: float | None = None,
                      log_dir: str | os.PathLike[str] | None = None, ui: "str | Display" = "auto",
                      rdzv_timeout: float | None = None,
                      display_ranks: int | Iterable[int] | str | None = None,
                      cluster: "RayCluster | SlurmCluster | None" = None,
                      stall_after: float | None = DEFAULT_STALL_AFTER,
                      lines_per_second: int | str = DEFAULT_LINES_PER_SECOND,
                      cell_output: int | str = DEFAULT_CELL_OUTPUT) -> list[Any]:
    """Run ``function(*args, **kwargs)`` on ``num_processes`` ranks and return every rank's result.

    The first fourteen parameters are Hugging Face Accelerate's ``notebook_launcher``'s, in the same
    order and with the same defaults, so swapping the import is enough; the rest are keyword-only.

    Args:
        function: What every rank runs: ``function(*args, **kwargs)``. Define it in a cell; create the
            Accelerator / process group / CUDA tensors inside it.
        args: Positional arguments (a tuple or list; one argument is ``args=(value,)``).
        num_processes: Ranks on this machine: any whole number (``int``, NumPy's ``int64``, ...).
            ``None``: one per visible CUDA GPU, else 1. On GPUs at most the number visible; on CPU up
            to 8 per core (at least 64; they share the cores). With ``start_method="xla"`` it counts
            XLA devices: ``None`` or all of them, or 1. With TorchTPU (torch_tpu and TPU devices it
            drives) one rank per TPU device: ``None`` or a device count it has a layout for.
        mixed_precision: ``"no"``, ``"fp16"``, ``"bf16"`` or ``"fp8"``; exported as
            ``ACCELERATE_MIXED_PRECISION``, so ``Accelerator()`` in each rank uses it.
        use_port: Rendezvous TCP port on ``master_addr``. Left at the default and busy, a free port is
            chosen (and said); a port you chose that is busy is an error.
        master_addr: Address of node 0 (the rendezvous store): a non-empty host name or IP address.
        node_rank: This machine's index among ``num_nodes``.
        num_nodes: Machines taking part; each runs ``notebook_launcher`` with its own ``node_rank``.
        rdzv_backend: ``"static"``, ``"c10d"``, ``"etcd"`` or ``"etcd-v2"`` (multi-node rendezvous,
            as in torchrun).
        rdzv_endpoint: Rendezvous endpoint for the dynamic backends (default ``master_addr:use_port``).
        rdzv_conf: Rendezvous options for the dynamic backends.
        rdzv_id: Rendezvous job id for the dynamic backends.
        max_restarts: How many times a failed group is restarted before the error is raised.
        monitor_interval: Seconds between the supervisor's checks (used up to 0.1 s); a finite
            number > 0.
        log_line_prefix_template: Prefix of every output line, default ``[rank N]``. torchrun's
            syntax, rendered as torchrun renders it: ``"${role_name}-${rank}: "`` gives
            ``default-0: ...``; or ``str.format`` syntax, ``"[{rank}]: "``. Fields ``rank`` (global),
            ``local_rank``, ``role_name`` (``default``), ``node_rank``.
        kwargs: Keyword arguments for ``function``.
        start_method: ``"fork"`` (default where safe: fast, the notebook's globals are inherited),
            ``"spawn"`` (fresh interpreters; the function and arguments travel with cloudpickle;
            needed after CUDA was initialized in the notebook) or ``"xla"`` (torch_xla's xmp.spawn;
            the default when a TPU or ``PJRT_DEVICE`` is found). TorchTPU ranks start with ``None``
            or ``"spawn"`` (docs/guides/tpu.md; ``NOTEBOOK_LAUNCH_DEVICE=tpu`` or ``cpu`` chooses).
        timeout: Seconds (> 0; ``float("inf")`` means none, like ``None``); past it every rank is
            stopped and ``LaunchError`` says where each rank was.
        log_dir: Folder for the ``rank<N>.log`` files; default a new folder per run under
            ``~/.cache/notebook_launch/runs`` (``NOTEBOOK_LAUNCH_LOG_DIR`` moves it).
        ui: ``"auto"``, ``"widget"``, ``"html"``, ``"rich"``, ``"text"`` or ``"none"``: how the run
            is shown; or a display of your own, an instance of ``notebook_launch.display.Display``
            (its ``start``, ``line``, ``refresh`` and ``close`` are called with the run state, as
            the panel's are; it may set ``state.stop_requested`` as the Stop button does).
        rdzv_timeout: Seconds every node has to join the rendezvous (multi-node or
            ``max_restarts > 0``); default ``rdzv_conf["join_timeout"]``/``["timeout"]``, else 900 s
            (torch elastic's default). With ``cluster=``: how long to wait for Ray to place every rank.
        display_ranks: Whose IPython ``display()`` calls (HTML, images, the Transformers Trainer's
            notebook progress) the cell shows: ``None`` for rank 0, a global rank or a list of them,
            or ``"all"``.
        cluster: ``RayCluster(address=..., resources_per_rank=..., placement=...)`` runs
            ``num_processes`` ranks as Ray actors on that cluster (one placement group), instead of
            processes on this machine; ``SlurmCluster(nodes=..., cpus_per_rank=..., partition=..., time=...)``
            runs them as tasks of one SLURM job (docs/slurm.md).
        stall_after: Seconds the whole run may show no sign of progress (no output line,
            ``progress()`` step, CPU time, I/O or stack change on any rank) before its ranks are
            marked stalled and the panel says where each one is; nothing is stopped. ``None``: not
            watched. Default 300 s (``DEFAULT_STALL_AFTER``; why: ``diagnose/stall.py``).
        lines_per_second: How many output lines a second of each rank the cell shows (a flood of
            prints would otherwise slow the kernel and bury the panel); the rest are in the rank's
            log file. ``"all"``: every line.
        cell_output: How many bytes of the ranks' output lines the cell keeps over the whole run
            (default 200,000), so that a run of hours leaves a cell and a saved notebook a browser can
            open: each rank's first lines, then a rolling tail replaced in place, saying how many lines
            are only in the log files. Lines every rank prints alike show once (``[ranks 0-7] ...``).
            ``"all"``: every line in the cell.

    Returns:
        Each local rank's return value, in rank order (tensors moved to the CPU).

    Raises:
        LaunchError: A rank failed (naming it, with its traceback), timed out or could not report.
        GuardError: Launching now would misbehave (an Accelerator or CUDA already in the notebook...).
        LaunchArgumentError: An argument is invalid; nothing was started.
    """
    parameters = dict(locals())   # notebook_launcher's arguments, before any other name is set
    __tracebackhide__ = True  # noqa: F841  (IPython and pytest hide this frame)
    try:
        preflight.check_not_inside_rank()
        from .hooks import install   # the guards track the notebook from its first launch on
        install(by="the first launch")
        options = entry_options(parameters)
        return launch(options, cluster)
    except (NotebookLaunchError, KeyboardInterrupt) as err:
        if isinstance(err, LaunchError):   # torch elastic's ChildFailedError.name: the entrypoint's name
            err.name = getattr(function, "__name__", type(function).__name__)
        # The user needs the rank's traceback (in the message), not our supervisor's frames.
        if isinstance(err, KeyboardInterrupt):
            raise user_interrupt(err) from None   # shows the user's frames only (errors.render)
        raise err.with_traceback(None) from None


def launch(options: LaunchOptions, cluster: "RayCluster | SlurmCluster | None" = None) -> list[Any]:
    """The launch itself, from validated options, on the engine they and ``cluster=`` pick
    (``engines.engine_for``); notebook_launcher only trims the traceback of its errors."""
    engine = engine_for(options, cluster)
    if engine.line_prefix and not options.line_prefix:   # ranks on several machines: say which
        options = dataclasses.replace(options, line_prefix=engine.line_prefix)
    return engine.launch(options)
