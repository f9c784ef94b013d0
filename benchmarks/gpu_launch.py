"""Warm launches on a machine with NVIDIA GPUs, ours beside torch's ``start_processes``: fork with
CUDA untouched in the notebook, then the CUDA-safe start once CUDA is initialized there (ranks forked
from the warm start process), and fresh Pythons (spawn). One rank per GPU, a trivial function and a
first CUDA op. Not part of ``benchmarks/run.py`` (no GPU there); run it on a GPU machine:

    python -m benchmarks.gpu_launch --repeats 8 --out gpu-launch.md

Why torch's rows come in three kinds: each of our ranks calls ``torch.cuda.set_device(LOCAL_RANK)``
before the function (so a rank's CUDA work, and any library's, lands on its own GPU), which starts
the CUDA driver in that rank: hundreds of milliseconds a launch, far more than the launch itself.
A bare ``start_processes`` of a function that never touches CUDA pays none of it; the fair floor is
the same launch whose function calls ``set_device`` (what Accelerate and Lightning do in each rank).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Callable

from .common import fmt_samples, free_port


def trivial() -> int:
    return os.getpid()


def first_cuda_op() -> float:
    import torch
    return (torch.ones(2, device="cuda") * 3).sum().item()


def bare(index: int) -> None:
    return None


def bare_set_device(index: int) -> None:
    import torch
    torch.cuda.set_device(index)


def bare_set_device_and_op(index: int) -> None:
    import torch
    torch.cuda.set_device(index)
    (torch.ones(2, device="cuda") * 3).sum().item()


def timed(launch: Callable[[], Any], repeats: int) -> list[float]:
    """Seconds of each of ``repeats`` launches after one untimed (warm process)."""
    launch()
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        launch()
        samples.append(time.perf_counter() - started)
    return samples


def ours(fn: Callable[[], Any], ranks: int, fresh: bool = False, **options: Any) -> Callable[[], Any]:
    """Our launch; ``fresh``: with the start process switched off (each rank a fresh Python)."""
    from notebook_launch import notebook_launcher
    from notebook_launch.detect.platform import START_PROCESS_SWITCH

    def launch() -> Any:
        if fresh:
            os.environ[START_PROCESS_SWITCH] = "0"
        try:
            return notebook_launcher(fn, num_processes=ranks, use_port=free_port(), **options)
        finally:
            if fresh:
                os.environ.pop(START_PROCESS_SWITCH, None)
    return launch


def theirs(fn: Callable[[int], None], ranks: int, method: str) -> Callable[[], Any]:
    from torch.multiprocessing import start_processes
    return lambda: start_processes(fn, nprocs=ranks, start_method=method)


def measure(repeats: int) -> list[tuple[str, list[float]]]:
    import torch
    from notebook_launch.notebook.cuda_tracking import count_gpus_without_poisoning
    ranks = count_gpus_without_poisoning()
    if not torch.version.cuda or ranks == 0:
        sys.exit("benchmarks.gpu_launch: no CUDA torch or no GPU visible here")
    rows = [
        ("start_processes (fork), function touches no CUDA", timed(theirs(bare, ranks, "fork"), repeats)),
        ("start_processes (fork), set_device", timed(theirs(bare_set_device, ranks, "fork"), repeats)),
        ("start_processes (fork), set_device + first CUDA op",
         timed(theirs(bare_set_device_and_op, ranks, "fork"), repeats)),
        ("ours, fork (CUDA untouched in the notebook), trivial", timed(ours(trivial, ranks), repeats)),
        ("ours, fork, first CUDA op", timed(ours(first_cuda_op, ranks), repeats)),
    ]
    started = time.perf_counter()
    torch.ones(1).cuda()   # from here the notebook holds CUDA: fork is no longer safe
    torch.cuda.synchronize()
    rows.append(("(CUDA initialized in the notebook, once)", [time.perf_counter() - started]))
    rows += [
        ("ours, CUDA held: ranks forked from the start process, trivial", timed(ours(trivial, ranks), repeats)),
        ("ours, CUDA held: start process, first CUDA op", timed(ours(first_cuda_op, ranks), repeats)),
        ("ours, CUDA held: fresh Pythons (spawn, start process off), trivial",
         timed(ours(trivial, ranks, fresh=True, start_method="spawn"), max(2, repeats // 3))),
        ("start_processes (spawn), set_device + first CUDA op",
         timed(theirs(bare_set_device_and_op, ranks, "spawn"), max(2, repeats // 3))),
    ]
    return rows


def report(rows: list[tuple[str, list[float]]]) -> str:
    import torch
    name = torch.cuda.get_device_name(0)
    lines = [f"Warm launches, one rank per GPU ({torch.cuda.device_count()} x {name}), torch {torch.__version__}, "
             f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs; median (min-max, n)", "",
             "| launch | time |", "|---|---|"]
    lines += [f"| {label} | {fmt_samples(samples, 's')} |" for label, samples in rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--out", help="also write the table to this file")
    args = parser.parse_args(argv)
    text = report(measure(args.repeats))
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":   # spawn's children import this module again: nothing may run then
    sys.exit(main())
