"""Item 5: extra memory per rank when the notebook holds a big tensor that the
launched function closes over, under fork and under spawn.

Method: the parent (the "notebook") allocates and writes a float32 tensor of
``tensor_mib``. Two functions differ only in that one closes over it and reads
every byte (``big.sum()``, read-only); each rank returns its own USS (unique
set size: pages no other process shares, psutil ``memory_full_info().uss``)
while it is still running. Extra per rank = USS(holds tensor) - USS(holds
nothing) for the same rank index within one repeat. Under fork the tensor's
pages stay shared copy-on-write, so they do not count; under spawn the tensor
is pickled into each rank, which then owns a private copy.
"""
from __future__ import annotations

from .table import NOT_AVAILABLE, Cell, Row
from .worker import Worker, WorkerError

FORK_GOAL_MB = 50


def measure(start_method, ranks, tensor_mib, repeats, log_dir):
    """(extra MB samples, one per rank per repeat; baseline MB samples) or a Cell with text."""
    worker = Worker("ours", log_dir=log_dir)
    extra, baseline = [], []
    try:
        worker.wait_ready()
        for _ in range(repeats):
            reply = worker.ask(op="memory", start_method=start_method, ranks=ranks, tensor_mib=tensor_mib)
            if "not_available" in reply:
                return Cell(text=f"{NOT_AVAILABLE} ({reply['not_available'][:120]})"), None
            for with_tensor, without in zip(reply["with_tensor"], reply["baseline"]):
                extra.append((with_tensor - without) / 1e6)
                baseline.append(without / 1e6)
    except WorkerError as exc:
        return Cell(text=f"error: {exc}"), None
    finally:
        worker.close()
    return Cell(samples=extra), Cell(samples=baseline, label="USS of a rank holding nothing")


def run(config, log_dir, say=print):
    rows = []
    mib = config["tensor_mib"]
    ranks = config["memory_ranks"]
    for start_method in ("fork", "spawn"):
        say(f"item 5: memory, {start_method}, {mib} MiB tensor, {ranks} ranks")
        cell, baseline = measure(start_method, ranks, mib, config["repeats"], log_dir)
        size = f"{mib / 1024:g} GiB" if mib >= 1024 else f"{mib} MiB"
        row = Row(item="5", measurement=f"extra memory (USS) per rank, the notebook holds a {size} tensor "
                                        f"the function closes over and reads, {start_method}",
                  ranks=str(ranks), unit="MB", cells={"ours": cell}, group=4)
        if baseline is not None:
            row.cells["other"] = [baseline]
        for name in ("accelerate", "start_processes", "elastic"):
            row.cells[name] = Cell(text="not measured")
        if start_method == "fork":
            row.goal = f"< {FORK_GOAL_MB} MB per rank"
            median = row.median("ours")
            row.met = ("unknown (not measured)" if median is None
                       else "yes" if median < FORK_GOAL_MB else "**NO (missed)**")
        else:
            row.goal = "— (reported: spawn must copy)"
        if cell.samples:
            row.ratios = f"extra / tensor size {row.median('ours') / (mib * 2**20 / 1e6):.3f}"
        rows.append(row)
    return rows
