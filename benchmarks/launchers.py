"""The launchers compared, each behind ``launch(fn, nprocs) -> results``.

Each is called the way its documentation shows, with the same function, on
CPU with fork. Imports happen in ``prepare`` (untimed), like a notebook cell
that imports before it launches.
"""
from __future__ import annotations

import os

from .common import free_port

LAUNCHERS = ("ours", "accelerate", "start_processes", "elastic")
# Item 13: the starts that must not fork the notebook (a CUDA context in it, ROCm/XPU, TorchTPU,
# Python 3.14's forkserver default), beside our fork start.
SPAWN_CLASS = ("ours", "ours_spawn", "ours_fresh_spawn", "mp_spawn", "elastic_spawn")
TITLES = {
    "ours": "This project",
    "accelerate": "Accelerate `notebook_launcher`",
    "start_processes": "`start_processes` (fork)",
    "elastic": "`elastic_launch` (fork)",
    "ours_spawn": "ours, spawn-class (warm start process)",
    "ours_fresh_spawn": "ours, spawn as fresh Pythons (start process off)",
    "mp_spawn": "`start_processes` (spawn)",
    "elastic_spawn": "`elastic_launch` (spawn)",
}
# The launchers the plots draw against rank count (elastic_launch is what Accelerate runs: it
# would lie on Accelerate's curve), with their legend labels.
PLOT_LABELS = {
    "ours": "This project",
    "accelerate": "Accelerate notebook_launcher",
    "start_processes": "torch start_processes (fork)",
}


def prepare(name: str) -> None:
    import torch  # noqa: F401  (torch is imported in the parent for every launcher)
    if name == "ours":
        import notebook_launch  # noqa: F401
    elif name == "accelerate":
        import accelerate  # noqa: F401
    elif name == "start_processes":
        import torch.multiprocessing  # noqa: F401
    elif name == "elastic":
        import torch.distributed.launcher.api  # noqa: F401
    elif name in ("ours_spawn", "ours_fresh_spawn"):
        if name == "ours_fresh_spawn":
            os.environ["NOTEBOOK_LAUNCH_START_PROCESS"] = "0"   # every rank a fresh Python, as before
        import notebook_launch  # noqa: F401
    elif name == "mp_spawn":
        import torch.multiprocessing  # noqa: F401
    elif name == "elastic_spawn":
        import torch.distributed.launcher.api  # noqa: F401
    else:
        raise ValueError(f"unknown launcher {name!r}; choose one of {LAUNCHERS}")


def launch(name: str, fn, nprocs: int, **options):
    return _LAUNCH[name](fn, nprocs, **options)


def launch_ours(fn, nprocs, start_method=None):
    from notebook_launch import notebook_launcher
    # A free port for every launcher alike: on a shared machine 29500 can be taken
    # between the launcher's check and rank 0's bind.
    results = notebook_launcher(fn, num_processes=nprocs, start_method=start_method, use_port=free_port())
    if len(results) != nprocs:
        raise RuntimeError(f"notebook_launcher returned {len(results)} results for {nprocs} ranks")
    return results


def launch_accelerate(fn, nprocs):
    from accelerate import notebook_launcher
    notebook_launcher(fn, num_processes=nprocs, use_port=str(free_port()))  # returns None
    return None


def _start_processes_entry(index, fn, nprocs, port):
    """start_processes passes only the index: the distributed env is ours to set."""
    os.environ.update(RANK=str(index), LOCAL_RANK=str(index), WORLD_SIZE=str(nprocs),
                      LOCAL_WORLD_SIZE=str(nprocs), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    fn()


def launch_start_processes(fn, nprocs, start_method="fork"):
    from torch.multiprocessing import start_processes
    start_processes(_start_processes_entry, args=(fn, nprocs, free_port()), nprocs=nprocs,
                    join=True, start_method=start_method)
    return None


def launch_elastic(fn, nprocs, start_method="fork"):
    """The configuration Accelerate's notebook_launcher builds, without Accelerate (with
    ``start_method="spawn"``: what Accelerate 1.14+ runs on ROCm and XPU)."""
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nprocs, run_id="none",
                          rdzv_endpoint=f"127.0.0.1:{free_port()}", rdzv_backend="static",
                          rdzv_configs={"rank": 0}, max_restarts=0, monitor_interval=0.1,
                          start_method=start_method)
    results = elastic_launch(config=config, entrypoint=fn)()
    if len(results) != nprocs:
        raise RuntimeError(f"elastic_launch returned {len(results)} results for {nprocs} ranks")
    return results


_LAUNCH = {"ours": launch_ours, "accelerate": launch_accelerate,
           "start_processes": launch_start_processes, "elastic": launch_elastic,
           "ours_spawn": lambda fn, nprocs: launch_ours(fn, nprocs, start_method="spawn"),
           "ours_fresh_spawn": lambda fn, nprocs: launch_ours(fn, nprocs, start_method="spawn"),
           "mp_spawn": lambda fn, nprocs: launch_start_processes(fn, nprocs, start_method="spawn"),
           "elastic_spawn": lambda fn, nprocs: launch_elastic(fn, nprocs, start_method="spawn")}
