"""``start_ranks``, the public entry of persistent ranks: ``persistent.pool.Ranks`` over the transport
of the engine ``engines.engine_for`` picks (forked or spawned on this machine: ``engines.local``; Ray
actors on a cluster: ``engines.ray``; srun steps of a held SLURM allocation: ``engines.slurm``). Here,
above both the pool and the engines, so that neither imports the other's side of it."""
from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING

from .display.cell_budget import DEFAULT_CELL_OUTPUT
from .errors import LaunchArgumentError
from .planning.options import DEFAULT_LINES_PER_SECOND, DEFAULT_USE_PORT, validate_interrupt_grace
from .planning.preflight import check_not_inside_rank
from .diagnose.stall import DEFAULT_STALL_AFTER
from .engines import engine_for
from .persistent.pool import DEFAULT_GRACE, Ranks, trimmed

if TYPE_CHECKING:
    from .display.base import Display
    from .engines.ray.cluster import RayCluster
    from .engines.slurm.cluster import SlurmCluster
    from .wire.plan import StartMethod


@trimmed
def start_ranks(num_processes: int | None = None, mixed_precision: str = "no",
                use_port: int | str = DEFAULT_USE_PORT, master_addr: str = "127.0.0.1", *,
                start_method: StartMethod | None = None, timeout: float | None = None,
                log_dir: str | os.PathLike[str] | None = None, ui: "str | Display" = "auto",
                log_line_prefix_template: str | None = None,
                interrupt_grace: float = DEFAULT_GRACE,
                display_ranks: int | Iterable[int] | str | None = None,
                cluster: "RayCluster | SlurmCluster | None" = None, stall_after: float | None = DEFAULT_STALL_AFTER,
                lines_per_second: int | str = DEFAULT_LINES_PER_SECOND,
                cell_output: int | str = DEFAULT_CELL_OUTPUT) -> Ranks:
    """Fork ``num_processes`` ranks now and keep them: each ``run()`` then calls a function
    on the same processes, whose namespace (models, data, an initialized process group)
    lives on between calls. Options mean what they mean for ``notebook_launcher``;
    ``timeout`` is the default for each call; ``interrupt_grace`` the seconds interrupted
    ranks have to come back before every rank is stopped (and restarted on the next call).
    ``start_method="spawn"``: fresh interpreters (after CUDA was initialized in the notebook,
    where a fork is refused): each call's function and a ``%%ranks`` cell's values travel
    with cloudpickle, as they do to forked ranks; the ranks do not start with a copy of the
    notebook's globals, only what calls, cells and ``push`` bring.
    ``ui``: as for ``notebook_launcher``, a display of your own too (a ``Display`` instance);
    it shows each call but ``push``/``pull`` (quiet), with the call's own run state (``start`` to
    ``close`` per call).
    ``stall_after``: seconds a call's ranks may all show no sign of progress before they are
    marked stalled (nothing is stopped; see ``diagnose.stall``), the default of each call;
    None: not watched. ``lines_per_second``: each rank's output lines a second a call's cell
    shows ("all": every line), the default of each call. ``cell_output``: the bytes of output lines
    each call leaves in its cell (as for ``notebook_launcher``). ``ranks.stacks()`` says where every
    rank is, during a call (from another thread) or between calls. ``cluster``: a ``RayCluster``
    (the ranks are Ray actors) or a ``SlurmCluster`` (srun steps of one SLURM job, held until
    ``close()``); ``num_processes`` is then the total number of ranks.
    Use ``with start_ranks(2) as ranks:`` or call ``close()``.
    """
    parameters = dict(locals())   # start_ranks' arguments, before any other name is set
    check_not_inside_rank()
    from .hooks import install   # the guards track the notebook from its first launch on
    install(by="the first launch")
    if cluster is None and start_method not in (None, "fork", "spawn"):
        raise LaunchArgumentError(
            f"start_ranks(start_method={start_method!r}): persistent ranks are forked or spawned, so "
            f"start_method must be 'fork', 'spawn' or None; use notebook_launcher for xla")
    grace = validate_interrupt_grace(interrupt_grace)   # the one check, for every kind of pool
    engine = engine_for(None, cluster)
    if engine.line_prefix and not log_line_prefix_template:   # ranks on several machines: say which
        parameters["log_line_prefix_template"] = engine.line_prefix
    return engine.start_ranks(parameters, grace)
