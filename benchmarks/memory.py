"""Item 5: extra memory per rank when the notebook holds a big tensor that the
launched function closes over, under fork and under spawn.

Method: the parent (the "notebook") allocates and writes a float32 tensor of
``tensor_mib``. Functions differ only in what they do with it: one closes over
it and reads every byte (``big.sum()``, read-only), one ignores it; each rank
returns its own USS (unique set size: pages no other process shares, psutil
``memory_full_info().uss``) while it is still running. Extra per rank =
USS(reads tensor) - USS(holds nothing) for the same rank index within one
repeat. Under fork the tensor's pages stay shared copy-on-write, so they do
not count; under spawn the tensor's bytes go once into a memfd that every rank
maps copy-on-write (shared_tensors), so what a rank reads is shared too, once
every rank has read it (USS counts a page mapped by one process only).
Calibration (fork): a function that writes every byte must show about the
tensor's size, or the method could not see a copy.
"""
from __future__ import annotations

from .table import NOT_AVAILABLE, Cell, Row
from .worker import Worker, WorkerError

FORK_GOAL_MB = 50


def measure(start_method, ranks, tensor_mib, repeats, log_dir, kinds=("read", "nothing")):
    """{kind: Cell of extra MB per rank} (the "nothing" Cell holds the baseline USS itself), or a text Cell."""
    worker = Worker("ours", log_dir=log_dir)
    samples: dict[str, list] = {kind: [] for kind in kinds}
    try:
        worker.wait_ready()
        for _ in range(repeats):
            reply = worker.ask(op="memory", start_method=start_method, ranks=ranks, tensor_mib=tensor_mib,
                               kinds=list(kinds))
            if "not_available" in reply:
                return Cell(text=f"{NOT_AVAILABLE} ({reply['not_available'][:120]})")
            for kind in kinds:
                for uss, baseline in zip(reply[kind], reply["nothing"]):
                    samples[kind].append((uss if kind == "nothing" else uss - baseline) / 1e6)
    except WorkerError as exc:
        return Cell(text=f"error: {exc}")
    finally:
        worker.close()
    return {kind: Cell(samples=values) for kind, values in samples.items()}


def run(config, log_dir, say=print):
    rows = []
    mib = config["tensor_mib"]
    ranks = config["memory_ranks"]
    size = f"{mib / 1024:g} GiB" if mib >= 1024 else f"{mib} MiB"
    for start_method in ("fork", "spawn"):
        say(f"item 5: memory, {start_method}, {size} tensor, {ranks} ranks")
        kinds = ("read", "nothing", "write") if start_method == "fork" else ("read", "nothing")
        cells = measure(start_method, ranks, mib, config["repeats"], log_dir, kinds)
        row = Row(item="5", measurement=f"extra memory (USS) per rank, the notebook holds a {size} tensor "
                                        f"the function closes over and reads, {start_method}",
                  ranks=str(ranks), unit="MB", group=4)
        if isinstance(cells, Cell):
            row.cells["ours"] = cells
        else:
            row.cells["ours"] = cells["read"]
            row.cells["other"] = [Cell(samples=cells["nothing"].samples, label="USS of a rank holding nothing")]
            if "write" in cells:
                row.cells["other"].append(Cell(samples=cells["write"].samples,
                                               label="calibration, a rank that writes the tensor, extra"))
            row.ratios = f"extra / tensor size {row.median('ours') / (mib * 2**20 / 1e6):.3f}"
        for name in ("accelerate", "start_processes", "elastic"):
            row.cells[name] = Cell(text="not measured")
        if start_method == "fork":
            row.goal = f"< {FORK_GOAL_MB} MB per rank"
            median = row.median("ours")
            row.met = ("unknown (not measured)" if median is None
                       else "yes" if median < FORK_GOAL_MB else "**NO (missed)**")
        else:
            row.goal = "— (reported: ranks map the notebook's one copy)"
        rows.append(row)
    return rows
