"""Lightning's process-starting DDP strategies join the launched ranks instead of starting more.

``Trainer(strategy="ddp_notebook")`` (and ``"ddp_fork"``, ``"ddp_spawn"``, their
``..._find_unused_parameters_*`` variants, ``DDPStrategy(start_method="fork"|"spawn"|"forkserver")``,
and the same for Fabric) always gets Lightning's ``_MultiProcessingLauncher``, which starts
``devices`` processes of its own (``DDPStrategy._configure_launcher``, Lightning 2.6,
lightning/{pytorch,fabric}/strategies/ddp.py): inside a launched rank that is a second set of
ranks per rank, all binding the same MASTER_PORT ("address already in use" deep in Lightning).
``strategy="ddp"`` is fine: its ``_SubprocessScriptLauncher`` starts nothing when the cluster
environment says the processes exist (``creates_processes_externally``), which is what a rank's
torchelastic-style environment makes Lightning pick (TorchElasticEnvironment, plan.py).

So in a rank, ``DDPStrategy._configure_launcher`` is wrapped: when the cluster environment creates
processes externally, the strategy gets the same launcher ``"ddp"`` gets, for every start method;
a user moving a notebook from ``ddp_notebook`` keeps their Trainer line. Outside a launched rank
nothing changes. The wrap is applied when Lightning's ddp modules are imported (now, or right
after the rank imports them: ``after_import``), for the four module names
Lightning ships under (lightning.pytorch, pytorch_lightning, lightning.fabric, lightning_fabric).
"""
from __future__ import annotations

import importlib
import logging
import types
from typing import Any

from ..after_import import after_import

log = logging.getLogger("notebook_launch")

# module of the DDP strategy -> module of the launcher that starts nothing for external processes
DDP_MODULES = {
    "lightning.pytorch.strategies.ddp": "lightning.pytorch.strategies.launchers.subprocess_script",
    "pytorch_lightning.strategies.ddp": "pytorch_lightning.strategies.launchers.subprocess_script",
    "lightning.fabric.strategies.ddp": "lightning.fabric.strategies.launchers.subprocess_script",
    "lightning_fabric.strategies.ddp": "lightning_fabric.strategies.launchers.subprocess_script",
}


def install(spec: Any = None) -> None:
    """Wrap every Lightning DDP strategy already imported, and those imported later (a rank hook:
    ``spec`` is the rank's RankSpec, unused)."""
    for name in DDP_MODULES:
        after_import(name, patch)


def patch(module: types.ModuleType) -> None:
    """Wrap ``module.DDPStrategy._configure_launcher`` (idempotent)."""
    strategy = getattr(module, "DDPStrategy", None)
    original = getattr(strategy, "_configure_launcher", None)
    if strategy is None or original is None or getattr(original, "_notebook_launch_wrapped", False):
        return
    launcher_module = DDP_MODULES[module.__name__]

    def _configure_launcher(self: Any) -> None:
        environment = getattr(self, "cluster_environment", None)
        start_method = getattr(self, "_start_method", "popen")
        if start_method != "popen" and environment is not None and environment.creates_processes_externally:
            # Inside a launched rank: the processes exist; join them as strategy="ddp" does.
            launchers = importlib.import_module(launcher_module)
            self._launcher = launchers._SubprocessScriptLauncher(environment, self.num_processes, self.num_nodes)
            log.debug("Lightning DDPStrategy(start_method=%r) joins the launched ranks", start_method)
            return
        original(self)

    _configure_launcher._notebook_launch_wrapped = True  # type: ignore[attr-defined]
    _configure_launcher.__wrapped__ = original  # type: ignore[attr-defined]
    strategy._configure_launcher = _configure_launcher
