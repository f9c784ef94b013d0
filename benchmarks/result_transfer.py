"""Item 8: a rank returns a state_dict; how long until the notebook holds it, and at what memory cost.

Three ways to move the same bytes, side by side in one run:
- ours: ``notebook_launcher(fn, num_processes=ranks)`` where each rank builds the
  state_dict and returns it (fork, ``ui`` default, a free port);
- the ``torch.multiprocessing`` anchor: ``ranks`` processes forked with its
  context, each building the same state_dict and putting it on a
  ``torch.multiprocessing.Queue`` (shared memory), the parent taking every one;
- the memcpy floor: copying the same number of bytes once in the notebook
  (``torch.empty_like(t).copy_(t)`` of a tensor of ranks x size).

Each way runs in its own worker process. The two that fork keep their parent on one
torch thread: a child forked after its parent ran an OpenMP parallel region hangs
in its own first one (libgomp, see FIELD_NOTES); the memcpy floor uses torch's
default threads.

Time: call to return (ours), start to the last ``get`` (Queue); both include
the ranks building their tensors. The transfer alone is ours minus the same
launch whose ranks build the state_dict and return None (the goal's ratio).
Peak extra memory, notebook: VmHWM after the call and after reading every
byte of what came back, minus VmRSS before
(the peak is reset with /proc/self/clear_refs). Peak extra memory per rank:
a thread in each rank samples, after the state_dict is built, its VmRSS plus
what its tensor memfds hold (our result file is written with pwrite, so its
pages are in no process's RSS), minus the value when the state_dict was
ready; the largest sample is reported.

Persistent ranks (``start_ranks``, one pool per rank count, kept in the worker between
samples), the same bytes both ways:
- ``ranks.run(fn)`` where each rank builds and returns the state_dict (the result path;
  transfer: minus the same call returning None);
- ``ranks.push(sd=state_dict)`` of one state_dict built in the notebook (notebook ->
  every rank; transfer: minus a push of an int), then ``ranks.pull("sd")`` (every
  rank -> the notebook; minus a pull of an int). The notebook's peak extra memory is
  VmHWM as above plus, for push, the memfd the tensors go through (it becomes the
  ranks' copy: they map its pages, so the system holds the payload once more, not per rank).

numpy and bytes results (issue 32 item 5), beside the tensor rows: each rank returns the same
number of bytes as 8 float32 numpy arrays in a dict, or as one ``bytes``; side by side with
- a plain pickle round trip in the notebook: ``pickle.loads(pickle.dumps(v, protocol=5))`` of
  every rank's value, built in the notebook first (not timed; its peak memory is measured from
  there, so it shows what the round trip itself adds);
- the memcpy floor: ``numpy.copy`` of an array of ranks x size (numpy copies on one thread).
Time and the notebook's memory as for the state_dict rows; the transfer is the launch minus
the same launch whose ranks build the value and return None.
"""
from __future__ import annotations

import gc
import os
import threading
import time

from .table import Cell, Row, fmt_ratio, ratio
from .worker import Worker, WorkerError

TENSORS_PER_STATE_DICT = 8
WAYS = ["ours", "baseline", "queue", "memcpy", "persistent", "persistent_baseline", "push_pull"]
# numpy and bytes results: the launch, the same launch returning None, a pickle round trip
KINDS = ("numpy", "bytes")
VALUE_WAYS = [f"{kind}_{what}" for kind in KINDS for what in ("ours", "baseline", "pickle")] + ["numpy_memcpy"]
_POOLS: dict = {}   # ranks -> the worker's persistent ranks (start_ranks)
SAMPLE_SECONDS = 0.002


def sizes(config: dict):
    """(MiB per rank, ranks) rows: full run 64/256/1024 MiB on 1 rank and 2 x 1 GiB; quick, the
    smallest that still makes a curve, on 1 and 2 ranks."""
    if config["quick"]:
        return [(4, 1), (4, 2)]
    return [(64, 1), (256, 1), (1024, 1), (1024, 2)]


# --- inside a rank --------------------------------------------------------------

def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _tensor_file_bytes() -> int:
    """Bytes held by this process's notebook_launch memfds (allocated pages)."""
    total = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            if "notebook_launch" in os.readlink(f"/proc/self/fd/{name}"):
                total += os.fstat(int(name)).st_blocks * 512
        except OSError:
            pass
    return total


_probe_stop = threading.Event()


def stop_probes() -> None:
    """(In a persistent rank) end the probe a call started: the process lives on."""
    import __main__
    _probe_stop.set()
    vars(__main__).pop("sd", None)   # what push_pull pushed


def _rank_memory_probe(report_path: str) -> None:
    """Sample RSS + memfd bytes until the process ends (or ``stop_probes``); keep the peak
    above the start in a file."""
    global _probe_stop
    start = _status_kib("VmRSS") * 1024 + _tensor_file_bytes()
    peak = 0
    fd = os.open(report_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    stop = _probe_stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            now = _status_kib("VmRSS") * 1024 + _tensor_file_bytes() - start
            if now > peak:
                peak = now
                os.pwrite(fd, f"{peak:<24d}".encode(), 0)
            time.sleep(SAMPLE_SECONDS)

    threading.Thread(target=sample, daemon=True).start()


def build_state_dict(mib: int, rank: int):
    import collections

    import torch
    numel = mib * 2**20 // 4 // TENSORS_PER_STATE_DICT
    return collections.OrderedDict(
        (f"layer{i}.weight", torch.full((numel,), float(rank + i))) for i in range(TENSORS_PER_STATE_DICT))


class ReturnsStateDict:
    """The launched function (module-level class, so every path gets the same code)."""

    def __init__(self, mib: int, report_dir: str, returns: bool = True) -> None:
        self.mib, self.report_dir, self.returns = mib, report_dir, returns

    def __call__(self, rank: int | None = None):
        rank = int(os.environ.get("RANK", "0")) if rank is None else rank
        state_dict = build_state_dict(self.mib, rank)
        if not self.returns:   # the baseline: the same launch, nothing to transfer
            return None
        _rank_memory_probe(os.path.join(self.report_dir, f"rank{rank}"))
        return state_dict


def build_value(kind: str, mib: int, rank: int):
    """``mib`` MiB as a rank's numpy result (8 float32 arrays in a dict) or one ``bytes``."""
    if kind == "bytes":
        return bytes([rank % 256]) * (mib * 2**20)
    import numpy
    numel = mib * 2**20 // 4 // TENSORS_PER_STATE_DICT
    return {f"layer{i}.weight": numpy.full(numel, float(rank + i), dtype=numpy.float32)
            for i in range(TENSORS_PER_STATE_DICT)}


class ReturnsValue:
    """The launched function of the numpy and bytes rows (as ReturnsStateDict)."""

    def __init__(self, kind: str, mib: int, report_dir: str, returns: bool = True) -> None:
        self.kind, self.mib, self.report_dir, self.returns = kind, mib, report_dir, returns

    def __call__(self):
        rank = int(os.environ.get("RANK", "0"))
        value = build_value(self.kind, self.mib, rank)
        if not self.returns:
            return None
        _rank_memory_probe(os.path.join(self.report_dir, f"rank{rank}"))
        return value


def _value_bytes(value) -> int:
    return len(value) if isinstance(value, bytes) else sum(a.nbytes for a in value.values())


def _read_value(value) -> None:
    """Read every byte once."""
    if isinstance(value, bytes):
        value.find(b"\xff\xfe")
    else:
        for array in value.values():
            float(array.sum())


def _queue_child(fn, rank, queue, done) -> None:
    queue.put(fn(rank))
    done.wait()   # torch shares storages by fd: stay alive until the parent has them


# --- in the worker process (the notebook) ----------------------------------------

def _reset_peak() -> int:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    return _status_kib("VmRSS") * 1024


def _read_all(results) -> float:
    total = 0.0
    for state_dict in results:
        for tensor in state_dict.values():
            total += float(tensor.sum())
    return total


def _rank_peaks(report_dir: str, ranks: int):
    peaks = []
    for rank in range(ranks):
        try:
            with open(os.path.join(report_dir, f"rank{rank}")) as f:
                peaks.append(int(f.read().strip() or 0))
        except (OSError, ValueError):
            peaks.append(0)
    return peaks


def measure_in_worker(command: dict, launch) -> dict:
    """One sample of one way (``command["way"]``); runs in a benchmark worker process."""
    import tempfile

    import torch
    mib, ranks, way = command["mib"], command["ranks"], command["way"]
    if way != "memcpy":
        torch.set_num_threads(1)   # no OpenMP pool in a parent that forks (see the module docstring)
    gc.collect()
    if way == "memcpy":
        source = torch.ones(mib * ranks * 2**20 // 4)
        before = _reset_peak()
        started = time.perf_counter()
        copy = torch.empty_like(source).copy_(source)
        seconds = time.perf_counter() - started
        extra = _status_kib("VmHWM") * 1024 - before
        del copy, source
        return {"seconds": seconds, "notebook_extra": extra, "rank_extra": []}
    if way in ("persistent", "persistent_baseline", "push_pull"):
        return _persistent(way, mib, ranks)
    if way in VALUE_WAYS:
        return _value_way(way, mib, ranks, launch)
    with tempfile.TemporaryDirectory(prefix="nl-transfer-") as report_dir:
        if way == "baseline":
            started = time.perf_counter()
            launch(ReturnsStateDict(mib, report_dir, returns=False), ranks)
            return {"seconds": time.perf_counter() - started}
        fn = ReturnsStateDict(mib, report_dir)
        before = _reset_peak()
        started = time.perf_counter()
        results = launch(fn, ranks) if way == "ours" else _through_queue(fn, ranks)
        seconds = time.perf_counter() - started
        got = sum(t.numel() for sd in results for t in sd.values()) * 4
        if got != mib * ranks * 2**20:
            raise RuntimeError(f"{way}: got {got} bytes back, expected {mib * ranks * 2**20}")
        read_started = time.perf_counter()
        _read_all(results)
        read_seconds = time.perf_counter() - read_started
        extra = _status_kib("VmHWM") * 1024 - before
        del results
        gc.collect()
        return {"seconds": seconds, "read_seconds": read_seconds, "notebook_extra": extra,
                "rank_extra": _rank_peaks(report_dir, ranks)}


def _value_way(way: str, mib: int, ranks: int, launch) -> dict:
    """One sample of a numpy or bytes row's way."""
    import pickle
    import tempfile
    kind, what = way.split("_", 1)
    if what == "memcpy":
        import numpy
        source = numpy.ones(mib * ranks * 2**20, dtype=numpy.uint8)
        before = _reset_peak()
        started = time.perf_counter()
        copy = numpy.copy(source)
        seconds = time.perf_counter() - started
        extra = _status_kib("VmHWM") * 1024 - before
        del copy, source
        return {"seconds": seconds, "notebook_extra": extra}
    if what == "pickle":
        values = [build_value(kind, mib, rank) for rank in range(ranks)]
        before = _reset_peak()
        started = time.perf_counter()
        results = [pickle.loads(pickle.dumps(value, protocol=5)) for value in values]
        seconds = time.perf_counter() - started
        extra = _status_kib("VmHWM") * 1024 - before
        del results, values
        gc.collect()
        return {"seconds": seconds, "notebook_extra": extra}
    with tempfile.TemporaryDirectory(prefix="nl-transfer-") as report_dir:
        if what == "baseline":
            started = time.perf_counter()
            launch(ReturnsValue(kind, mib, report_dir, returns=False), ranks)
            return {"seconds": time.perf_counter() - started}
        before = _reset_peak()
        started = time.perf_counter()
        results = launch(ReturnsValue(kind, mib, report_dir), ranks)
        seconds = time.perf_counter() - started
        got = sum(_value_bytes(value) for value in results)
        if got != mib * ranks * 2**20:
            raise RuntimeError(f"{way}: got {got} bytes back, expected {mib * ranks * 2**20}")
        read_started = time.perf_counter()
        for value in results:
            _read_value(value)
        read_seconds = time.perf_counter() - read_started
        extra = _status_kib("VmHWM") * 1024 - before
        del results
        gc.collect()
        return {"seconds": seconds, "read_seconds": read_seconds, "notebook_extra": extra,
                "rank_extra": _rank_peaks(report_dir, ranks)}


def _pool(ranks: int):
    if ranks not in _POOLS:
        for other in list(_POOLS):
            _POOLS.pop(other).close()
        from notebook_launch import start_ranks
        _POOLS[ranks] = start_ranks(ranks, ui="none")
    return _POOLS[ranks]


def _persistent(way: str, mib: int, ranks: int) -> dict:
    import tempfile
    pool = _pool(ranks)
    with tempfile.TemporaryDirectory(prefix="nl-transfer-") as report_dir:
        if way == "persistent_baseline":
            started = time.perf_counter()
            pool.run(ReturnsStateDict(mib, report_dir, returns=False))
            return {"seconds": time.perf_counter() - started}
        if way == "persistent":
            before = _reset_peak()
            started = time.perf_counter()
            results = pool.run(ReturnsStateDict(mib, report_dir))
            seconds = time.perf_counter() - started
            _check(results, mib * ranks)
            read_started = time.perf_counter()
            _read_all(results)
            read_seconds = time.perf_counter() - read_started
            extra = _status_kib("VmHWM") * 1024 - before
            del results
            pool.run(stop_probes)
            gc.collect()
            return {"seconds": seconds, "read_seconds": read_seconds, "notebook_extra": extra,
                    "rank_extra": _rank_peaks(report_dir, ranks)}
    # push_pull: one state_dict from the notebook to every rank, then every rank's copy back
    state_dict = build_state_dict(mib, 0)
    started = time.perf_counter()
    pool.push(sd=0)
    small_push = time.perf_counter() - started
    started = time.perf_counter()
    pool.pull("sd")
    small_pull = time.perf_counter() - started
    before = _reset_peak()
    started = time.perf_counter()
    frames = _memfd_bytes_written_by(lambda: pool.push(sd=state_dict))
    push_seconds = time.perf_counter() - started
    push_extra = _status_kib("VmHWM") * 1024 - before + frames
    before = _reset_peak()
    started = time.perf_counter()
    results = pool.pull("sd")
    pull_seconds = time.perf_counter() - started
    _check(results, mib * ranks)
    _read_all(results)
    pull_extra = _status_kib("VmHWM") * 1024 - before
    results = state_dict = None
    pool.run(stop_probes)
    gc.collect()
    return {"push_seconds": push_seconds, "push_baseline": small_push, "push_extra": push_extra,
            "pull_seconds": pull_seconds, "pull_baseline": small_pull, "pull_extra": pull_extra}


def _memfd_bytes_written_by(action) -> int:
    """Run ``action``; return the largest tensor memfd the notebook made meanwhile (its bytes
    are in no process's RSS: written with pwrite, then mapped by the ranks)."""
    from notebook_launch.wire import shared_tensors
    seen: list[int] = []
    real = shared_tensors.dumps

    def dumps(value, fd, base=None):
        made = [] if callable(fd) else [fd]   # a function: it makes the memfd at the first big part

        def make():
            made.append(fd())
            return made[-1]

        data = real(value, make if callable(fd) else fd, base)
        seen.extend(os.fstat(file).st_blocks * 512 for file in made if file is not None)
        return data

    shared_tensors.dumps = dumps
    try:
        action()
    finally:
        shared_tensors.dumps = real
    return max(seen, default=0)


def _check(results, mib: int) -> None:
    got = sum(t.numel() for sd in results for t in sd.values()) * 4
    if got != mib * 2**20:
        raise RuntimeError(f"got {got} bytes back, expected {mib * 2**20}")


def _through_queue(fn, ranks: int):
    import torch.multiprocessing as mp
    context = mp.get_context("fork")
    queue, done = context.Queue(), context.Event()
    children = [context.Process(target=_queue_child, args=(fn, rank, queue, done)) for rank in range(ranks)]
    for child in children:
        child.start()
    results = [queue.get() for _ in children]
    done.set()
    for child in children:
        child.join()
    return sorted(results, key=lambda sd: float(sd["layer0.weight"][0]))


# --- the parent: rows --------------------------------------------------------------

def _label(mib: int) -> str:
    return f"{mib / 1024:g} GiB" if mib >= 1024 else f"{mib} MiB"


def run(config: dict, log_dir: str, say=print):
    rows = []
    ours = Worker("ours", log_dir=log_dir)
    workers = {"ours": ours, "baseline": ours, "queue": Worker("start_processes", log_dir=log_dir),
               "memcpy": Worker("start_processes", log_dir=log_dir),
               "persistent": ours, "persistent_baseline": ours, "push_pull": ours}
    workers.update({way: ours for way in VALUE_WAYS if way.endswith(("_ours", "_baseline"))})
    plain = workers["memcpy"]   # pickle and memcpy in a process that launches nothing
    workers.update({way: plain for way in VALUE_WAYS if way.endswith(("_pickle", "_memcpy"))})
    ways = WAYS + VALUE_WAYS
    try:
        smallest, broken = min(sizes(config)), {}
        for way, worker in workers.items():   # untimed: first-launch imports are items 1 and 2's business
            try:
                worker.ask(op="transfer", way=way, mib=smallest[0], ranks=smallest[1])
            except WorkerError as exc:
                broken[way] = f"error: {exc}"
        for mib, ranks in sizes(config):
            say(f"item 8: result transfer, {ranks} x {_label(mib)}")
            samples: dict = {way: [] for way in ways}
            errors = dict(broken)
            for repeat in range(config["repeats"]):
                for way in ways[repeat % len(ways):] + ways[:repeat % len(ways)]:
                    if way in errors:
                        continue
                    try:
                        samples[way].append(workers[way].ask(op="transfer", way=way, mib=mib, ranks=ranks))
                    except WorkerError as exc:
                        errors[way] = f"error: {exc}"
            rows += _rows(mib, ranks, samples, errors)
            rows += _persistent_rows(mib, ranks, samples, errors)
            rows += [row for kind in KINDS for row in _value_rows(kind, mib, ranks, samples, errors)]
    finally:
        for worker in set(workers.values()):
            worker.close()
    return rows


def _cell(replies, key, scale=1.0, text=""):
    if text:
        return Cell(text=text)
    return Cell(samples=[r[key] * scale for r in replies])


def _rows(mib, ranks, samples, errors):
    payload = mib * 2**20 * ranks
    what = f"{ranks} x {_label(mib)}" if ranks > 1 else _label(mib)
    time_row = Row(item="8", measurement=f"rank returns a state_dict of {what} (8 float32 tensors), "
                                         "call to return", ranks=str(ranks), unit="s", group=5)
    time_row.cells["ours"] = _cell(samples["ours"], "seconds", text=errors.get("ours", ""))
    queue = _cell(samples["queue"], "seconds", text=errors.get("queue", ""))
    memcpy = _cell(samples["memcpy"], "seconds", text=errors.get("memcpy", ""))
    queue.label, memcpy.label = "torch.multiprocessing Queue (fork)", "memcpy of the same bytes in the notebook"
    read = _cell(samples["ours"], "read_seconds", text=errors.get("ours", ""))
    read.label = "ours, then reading every byte once"
    time_row.cells["other"] = [queue, memcpy, read]
    for name in ("accelerate", "start_processes", "elastic"):
        time_row.cells[name] = Cell(text="returns None" if name != "elastic" else "not measured")
    baseline = _cell(samples["baseline"], "seconds", text=errors.get("baseline", ""))
    baseline.label = "ours, same launch returning None"
    time_row.cells["other"].append(baseline)
    ours, floor = time_row.median("ours"), memcpy.median()
    transfer = ours - baseline.median() if ours is not None and baseline.median() is not None else None
    vs_floor, vs_queue = ratio(ours, floor), ratio(queue.median(), ours)
    transfer_vs_floor = ratio(transfer, floor)
    per_gib = f"; ours {ours / (payload / 2**30):.2f} s per GiB" if ours else ""
    time_row.ratios = (f"transfer (ours minus returning None)/memcpy {fmt_ratio(transfer_vs_floor)}; "
                       f"ours/memcpy {fmt_ratio(vs_floor)}; Queue/ours {fmt_ratio(vs_queue)}{per_gib}")
    time_row.curve, time_row.x, time_row.x_tick = "result_transfer", mib * ranks, what
    time_row.series = {"This project (notebook_launcher)": time_row.cells["ours"],
                       "torch.multiprocessing Queue (fork)": queue, "memcpy of the same bytes (the floor)": memcpy}
    if ranks == 2:
        time_row.goal = "transfer/memcpy ≤ 2x"
        time_row.met = ("unknown (a cell is missing)" if transfer_vs_floor is None
                        else "yes" if transfer_vs_floor <= 2 else "**NO (missed)**")
    memory_row = Row(item="8", measurement=f"peak extra memory moving a state_dict of {what}: "
                                           "notebook; per rank", ranks=str(ranks), unit="MB", group=5)
    memory_row.cells["ours"] = _memory_cell(samples["ours"], errors.get("ours", ""))
    queue_memory = _memory_cell(samples["queue"], errors.get("queue", ""))
    queue_memory.label = "torch.multiprocessing Queue (fork)"
    memory_row.cells["other"] = [queue_memory]
    for name in ("accelerate", "start_processes", "elastic"):
        memory_row.cells[name] = Cell(text="not measured")
    notebook, rank = _medians(samples["ours"])
    if notebook is not None:
        memory_row.ratios = (f"ours/payload: notebook {notebook / payload:.2f}, "
                             f"rank {rank / (payload / ranks):.2f}")
        if ranks == 2:   # the goal's row; smaller ones show the fixed cost (a few MB of pickling)
            memory_row.goal = "≤ 1.1 x payload, each side"
            memory_row.met = ("yes" if notebook <= 1.1 * payload and rank <= 1.1 * payload / ranks
                              else "**NO (missed)**")
    return [time_row, memory_row]


def _value_rows(kind, mib, ranks, samples, errors):
    """A numpy or bytes result: time against a plain pickle round trip and a memcpy, and the
    notebook's peak memory against the pickle round trip's (issue 32 item 5)."""
    payload = mib * 2**20 * ranks
    what = f"{ranks} x {_label(mib)}" if ranks > 1 else _label(mib)
    shape = "8 float32 numpy arrays in a dict" if kind == "numpy" else "one bytes object"
    ours_way, base_way, pickle_way = f"{kind}_ours", f"{kind}_baseline", f"{kind}_pickle"
    time_row = Row(item="8", measurement=f"rank returns {what} as {shape}, call to return",
                   ranks=str(ranks), unit="s", group=5)
    time_row.cells["ours"] = _cell(samples[ours_way], "seconds", text=errors.get(ours_way, ""))
    pickled = _cell(samples[pickle_way], "seconds", text=errors.get(pickle_way, ""))
    memcpy = _cell(samples["numpy_memcpy"], "seconds", text=errors.get("numpy_memcpy", ""))
    base = _cell(samples[base_way], "seconds", text=errors.get(base_way, ""))
    read = _cell(samples[ours_way], "read_seconds", text=errors.get(ours_way, ""))
    pickled.label = "pickle.loads(pickle.dumps(v)) in the notebook"
    memcpy.label = "numpy.copy of the same bytes in the notebook"
    base.label = "ours, same launch returning None"
    read.label = "ours, then reading every byte once"
    time_row.cells["other"] = [pickled, memcpy, base, read]
    for name in ("accelerate", "start_processes", "elastic"):
        time_row.cells[name] = Cell(text="—")
    ours = time_row.median("ours")
    transfer = ours - base.median() if ours is not None and base.median() is not None else None
    time_row.ratios = (f"transfer (ours minus returning None)/pickle round trip "
                       f"{fmt_ratio(ratio(transfer, pickled.median()))}; "
                       f"transfer/memcpy {fmt_ratio(ratio(transfer, memcpy.median()))}")
    memory_row = Row(item="8", measurement=f"peak extra memory, a rank returning {what} as {shape}: "
                                           "notebook; per rank", ranks=str(ranks), unit="MB", group=5)
    memory_row.cells["ours"] = _memory_cell(samples[ours_way], errors.get(ours_way, ""))
    pickle_memory = (Cell(text=errors.get(pickle_way) or "—") if errors.get(pickle_way) or not samples[pickle_way]
                     else Cell(text=f"notebook {_median_of(samples[pickle_way], 'notebook_extra') / 1e6:.0f} MB"))
    pickle_memory.label = "pickle round trip in the notebook"
    memory_row.cells["other"] = [pickle_memory]
    for name in ("accelerate", "start_processes", "elastic"):
        memory_row.cells[name] = Cell(text="—")
    notebook, rank = _medians(samples[ours_way])
    if notebook is not None:
        pickle_extra = _median_of(samples[pickle_way], "notebook_extra") if samples[pickle_way] else None
        memory_row.ratios = (f"/payload: notebook {notebook / payload:.2f}, rank {rank / (payload / ranks):.2f}"
                             + (f"; pickle round trip {pickle_extra / payload:.2f}" if pickle_extra else ""))
    return [time_row, memory_row]


def _median_of(replies, key):
    import statistics
    return statistics.median(r[key] for r in replies)


def _persistent_rows(mib, ranks, samples, errors):
    """Persistent ranks: a call's result, a push to every rank and a pull from every rank,
    each against a memcpy of the same bytes (issue 23: within 2x, peak within 1.1x)."""
    import statistics
    what = f"{ranks} x {_label(mib)}" if ranks > 1 else _label(mib)
    floor = _cell(samples["memcpy"], "seconds", text=errors.get("memcpy", "")).median()
    floor_one = floor / ranks if floor is not None else None   # push moves one state_dict
    rows = []

    def row(measurement, replies, key, base_cell, payload_floor, error):
        time_row = Row(item="8", measurement=measurement, ranks=str(ranks), unit="s", group=5)
        time_row.cells["ours"] = _cell(replies, key, text=error)
        for name in ("accelerate", "start_processes", "elastic"):
            time_row.cells[name] = Cell(text="—")
        floor_cell = Cell(samples=[payload_floor]) if payload_floor is not None else Cell(text="—")
        floor_cell.label = "memcpy of the same bytes in the notebook (median)"
        time_row.cells["other"] = [base_cell, floor_cell]
        median, base = time_row.median("ours"), base_cell.median()
        transfer = None
        if median is not None and base is not None:
            transfer = median - base
        time_row.ratios = f"transfer/memcpy {fmt_ratio(ratio(transfer, payload_floor))}"
        if ranks == 2:
            time_row.goal = "transfer/memcpy ≤ 2x"
            value = ratio(transfer, payload_floor)
            time_row.met = ("unknown (a cell is missing)" if value is None
                            else "yes" if value <= 2 else "**NO (missed)**")
        return time_row

    def median_of(replies, key):
        return statistics.median(r[key] for r in replies) if replies else None

    def labelled(cell, label):
        cell.label = label
        return cell

    base = labelled(_cell(samples["persistent_baseline"], "seconds", text=errors.get("persistent_baseline", "")),
                    "the same call returning None")
    rows.append(row(f"persistent ranks: `ranks.run` returns a state_dict of {what}, from the call to the results",
                    samples["persistent"], "seconds", base, floor, errors.get("persistent", "")))
    rows[-1].curve, rows[-1].x, rows[-1].x_tick = "result_transfer", mib * ranks, what
    rows[-1].series = {"This project, persistent ranks (ranks.run)": rows[-1].cells["ours"]}
    pushes = samples["push_pull"]
    error = errors.get("push_pull", "")
    rows.append(row(f"persistent ranks: `ranks.push` of one state_dict of {_label(mib)} to {ranks} rank(s)",
                    pushes, "push_seconds", labelled(_cell(pushes, "push_baseline", text=error), "push of an int"),
                    floor_one, error))
    rows.append(row(f"persistent ranks: `ranks.pull` of {what} (each rank's copy)",
                    pushes, "pull_seconds", labelled(_cell(pushes, "pull_baseline", text=error), "pull of an int"),
                    floor, error))
    payload = mib * 2**20 * ranks
    memory = Row(item="8", measurement=f"persistent ranks: the notebook's highest memory above the start, "
                                       f"{what}: run result; push (its memfd included); pull",
                 ranks=str(ranks), unit="MB", group=5)
    run_nb = median_of(samples["persistent"], "notebook_extra")
    run_rank = (statistics.median(max(r["rank_extra"] or [0]) for r in samples["persistent"])
                if samples["persistent"] else None)
    push_nb, pull_nb = median_of(pushes, "push_extra"), median_of(pushes, "pull_extra")
    if run_nb is None or run_rank is None or push_nb is None or pull_nb is None:
        memory.cells["ours"] = Cell(text=errors.get("persistent") or error or "—")
    else:
        memory.cells["ours"] = Cell(text=f"run {run_nb / 1e6:.0f} MB (rank {run_rank / 1e6:.0f} MB); "
                                         f"push {push_nb / 1e6:.0f} MB; pull {pull_nb / 1e6:.0f} MB")
        memory.ratios = (f"/payload: run {run_nb / payload:.2f} (rank {run_rank / (payload / ranks):.2f}); "
                         f"push {push_nb / (payload / ranks):.2f}; pull {pull_nb / payload:.2f}")
        if ranks == 2:
            memory.goal = "≤ 1.1 x payload, each side"
            worst = max(run_nb / payload, run_rank / (payload / ranks), push_nb / (payload / ranks),
                        pull_nb / payload)
            memory.met = "yes" if worst <= 1.1 else "**NO (missed)**"
    for name in ("accelerate", "start_processes", "elastic"):
        memory.cells[name] = Cell(text="—")
    rows.append(memory)
    return rows


def _medians(replies):
    if not replies:
        return None, None
    import statistics
    return (statistics.median(r["notebook_extra"] for r in replies),
            statistics.median(max(r["rank_extra"] or [0]) for r in replies))


def _memory_cell(replies, text):
    if text or not replies:
        return Cell(text=text or "—")
    notebook, rank = _medians(replies)
    return Cell(text=f"notebook {notebook / 1e6:.0f} MB; rank {rank / 1e6:.0f} MB (median of {len(replies)})")
