"""What a process that forks ranks imports once so its ranks share it: SLURM's node agent on each
node (``engines.slurm.node_agent``) and the warm start process on this machine (``engines.local.start_server``).

The module names come from the notebook, which chose them from the launched function's code
(``engines.local.warm_imports``: torch when the code names it, torch._dynamo and DDP's module when it
looks like training), as the local fork start imports them in the notebook before it forks.
"""
from __future__ import annotations

import importlib
import sys

# What every rank imports on its way to the user's function, whatever the function: cloudpickle to load
# the job, and numpy.random to restore the notebook's numpy random state (``spawn_context.restore_state``;
# numpy 2 imports it lazily: 12-17 ms of each rank's CPU when a rank imported it itself, issue 41).
# Where one is not installed, nothing is said: the notebook cannot have used it either.
EVERY_RANK = ("cloudpickle", "numpy", "numpy.random")


def warm(modules: list[str] | tuple[str, ...], *, quiet_if_missing: bool = False) -> list[str]:
    """Import our rank modules and ``modules``; the names that did not import. One that fails here
    is left to the ranks, which import it themselves and report its error as the run's; it is said
    on stderr unless ``quiet_if_missing`` and the package is simply not installed."""
    from .installs import warm as warm_ours
    warm_ours()   # as warm_for does
    failed = []
    for name in modules:
        if name in sys.modules:
            continue
        try:
            importlib.import_module(name)
        except Exception as exc:   # why: a speed-up only; the rank's own import says what is wrong
            failed.append(name)
            if quiet_if_missing and isinstance(exc, ModuleNotFoundError) and exc.name == name.split(".")[0]:
                continue
            print(f"notebook_launch: {sys.argv[0] or 'a start process'} could not import {name} "
                  f"({type(exc).__name__}: {exc}); each rank imports it itself", file=sys.stderr)
    return failed
