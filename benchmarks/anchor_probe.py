"""Run inside an anchor's own venv (scripts/setup-anchors.sh): times Meta's Monarch persistent
actors or torchrunx launches, and prints one JSON line. Imports nothing of this project, so the
anchor's venv needs only torch and the anchor.

    .venv-monarch/bin/python -m benchmarks.anchor_probe monarch   (then {"op": "calls", "calls": N} lines)
    .venv-torchrunx/bin/python -m benchmarks.anchor_probe torchrunx RANKS REPEATS
"""
from __future__ import annotations

import json
import os
import sys
import time


def monarch_session(commands, reply) -> None:
    """Start to the first call on 2 procs (an actor spawned on each), replied at once; then, for
    each ``{"op": "calls", "calls": N}`` read from ``commands``, N warm calls of a trivial
    endpoint, each ``.call().get()`` (every proc's value back, as ``ranks.run``), their times
    replied: one JSON line each way, as benchmarks/worker.py speaks; ``{"op": "exit"}`` or the
    end of input ends it. Served this way so that the harness can alternate short blocks of
    Monarch's calls with ours, both measured in the same moments of the machine."""
    from monarch.actor import Actor, current_rank, endpoint, this_host

    class Trivial(Actor):
        @endpoint
        def rank(self) -> int:
            return int(current_rank().rank)

    started = time.perf_counter()
    procs = this_host().spawn_procs(per_host={"procs": 2})
    actors = procs.spawn("trivial", Trivial)
    first = actors.rank.call().get()
    to_first = time.perf_counter() - started
    reply({"start_to_first": to_first, "values": sorted(value for _, value in first.items())})
    for line in commands:
        command = json.loads(line)
        if command.get("op") != "calls":
            break
        samples = []
        for _ in range(int(command["calls"])):
            began = time.perf_counter()
            actors.rank.call().get()
            samples.append(time.perf_counter() - began)
        reply({"warm": samples})


def trivial() -> int:
    return int(os.environ.get("RANK", "0"))


def torchrunx_launches(ranks: int, repeats: int) -> dict:
    """``repeats`` launches of a trivial function on ``ranks`` local workers after one warm-up,
    each returning every rank's value (``LaunchResult``)."""
    import torchrunx
    launcher = torchrunx.Launcher(hostnames=["localhost"], workers_per_host=ranks, backend=None)
    launcher.run(trivial)
    samples, values = [], []
    for _ in range(repeats):
        began = time.perf_counter()
        result = launcher.run(trivial)
        samples.append(time.perf_counter() - began)
        values = [result.rank(i) for i in range(ranks)]
    return {"launch": samples, "values": values}


def main(argv: list[str]) -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    reply = os.dup(1)
    os.dup2(devnull, 1)   # what the anchor prints goes nowhere, as the 'ours' worker's does

    def send(out: dict) -> None:
        os.write(reply, (json.dumps(out) + "\n").encode())

    if argv[0] == "monarch":
        monarch_session(sys.stdin, send)
    elif argv[0] == "torchrunx":
        send(torchrunx_launches(int(argv[1]), int(argv[2])))
    else:
        raise SystemExit(f"anchor_probe: unknown anchor {argv[0]!r}")
    sys.stdout.flush()
    os._exit(0)   # the anchors' runtimes (Monarch's Rust one) stop with the process


if __name__ == "__main__":
    main(sys.argv[1:])
