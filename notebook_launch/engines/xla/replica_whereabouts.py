"""Where XLA's replicas are (issue 20): xmp.spawn runs them as threads of processes under one
launcher (``engines.xla.launcher``), so no replica is a process of its own to ask by pid. Each replica
keeps its own record (``engines.xla.replicas``) in the process that runs it: the records are found
under the launcher, each such process is asked once for its threads (``stacks.collect``), and each
replica gets its own thread's stack. xm's collectives are lazy, so who waits is inferred from the
records (``who_waits``)."""
from __future__ import annotations

from typing import Callable, Sequence

from ...diagnose import stacks
from ...diagnose.hang_verdict import RankWhereabouts
from ...diagnose.memfds import memfds
from ...diagnose.proc_tasks import children
from ...diagnose.stacks import read_record


def replica_records(launcher: int) -> dict[int, tuple[int, str]]:
    """Ordinal -> (pid of the process running that replica, /proc path of its record), from the
    launcher and its descendants. A replica's forked child (a DataLoader worker) inherits the memfd:
    only the process the record names as its own counts."""
    from .replicas import REPLICA_RECORD_NAME   # only where XLA runs: the rank's module is not light

    found: dict[int, tuple[int, str]] = {}
    queue = [launcher]
    while queue:
        pid = queue.pop(0)
        queue.extend(children(pid))
        for name, paths in memfds(pid).items():
            ordinal = name.removeprefix(REPLICA_RECORD_NAME)
            if ordinal != name and ordinal.isdigit():
                for path in paths:   # its own, not one inherited from whatever forked it
                    record = read_record(path)
                    if record is not None and record[0] == pid:
                        found[int(ordinal)] = (pid, path)
                        break
    return found


def replica_whereabouts(launcher: int, local_ranks: Sequence[int],
                        global_rank: Callable[[int], int]) -> dict[int, RankWhereabouts]:
    """Where each replica is: its xm collective (its own record), its own thread's stack (one dump
    per process, split by thread), and, for a process that runs one replica only, the process's
    torch.distributed record too. Then who waits: see ``who_waits``."""
    records = replica_records(launcher)
    by_process: dict[int, list[int]] = {}
    for local in local_ranks:
        if local in records:
            by_process.setdefault(records[local][0], []).append(local)
    answers: dict[int, RankWhereabouts] = {}
    for pid, locals_here in by_process.items():
        process = stacks.collect([(global_rank(locals_here[0]), pid)])[0]
        for local in locals_here:
            record = stacks.read_record(records[local][1])
            where = RankWhereabouts(global_rank(local), note=process.note if not process.threads else "")
            if record is not None:
                _pid, where.main_thread, _signum, collective, inside = record
                if inside:
                    where.inside = collective
                else:
                    where.last = collective
            where.threads = [thread for thread in process.threads if thread.ident == where.main_thread]
            where.raw_stacks = process.raw_stacks
            if len(locals_here) == 1 and where.inside is None and where.last is None:
                where.inside, where.last = process.inside, process.last   # torch.distributed on XLA
            answers[local] = where
    who_waits(list(answers.values()))
    return answers


def who_waits(replicas: Sequence[RankWhereabouts]) -> None:
    """xm's collectives are lazy (``engines.xla.replicas``): a replica that issued collective #n waits
    in it when another replica has not issued #n (it cannot complete without it), or when another
    issued a different collective as its #n (the graphs do not match: a different order). Such
    replicas are marked ``inside`` it; the others keep it as the last one they called."""
    issued = [r for r in replicas if r.last is not None and r.last.op not in ("rendezvous", "xla_rendezvous")]
    if not issued:
        return
    for group in {r.last.group for r in issued if r.last is not None}:
        members = [r for r in replicas if r.last is None or r.last.group == group]
        numbers = {r.last.seq if r.last is not None else 0 for r in members}
        top = max(numbers)
        ops = {r.last.op for r in members if r.last is not None and r.last.seq == top}
        if len(numbers) > 1 or len(ops) > 1:
            for r in members:
                if r.last is not None and r.last.seq == top and r.last.group == group:
                    r.inside, r.last = r.last, None
