"""One launcher per Python process: the parent drives workers over a pipe.

Why separate processes: process-level caches must not leak between launchers.
Our fork backend imports torch._dynamo in the parent once (so forked ranks
share it); in a shared process Accelerate's children would inherit that import
and skip the 1-4 s each of them pays in a real notebook. So every launcher
gets its own fresh interpreter, and the parent asks the workers in turn, which
also lets it interleave launchers round-robin within each repeat.

Protocol: one JSON object per line on the worker's stdin; one JSON reply per
line on the worker's original stdout. The worker points fd 1 at /dev/null so
what launchers and ranks print costs the same for all and stays out of the pipe.
"""
from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
import time
import traceback
from typing import IO, Any

from .common import REPO_ROOT

REPLY_TIMEOUT = 300.0  # generous: the slowest call (8 ranks, Accelerate, loaded machine) takes ~1 min
# (launcher, what the worker had imported before its first launch), for the notes
READY_STATES: list[tuple[str, dict]] = []


class WorkerError(RuntimeError):
    pass


class Worker:
    """Parent side: start ``python -m benchmarks.worker LAUNCHER`` and ask it for measurements.

    ``argv`` starts another process that speaks the same protocol instead (an anchor's probe in
    its own venv, benchmarks/anchor_probe.py), its first line being its "ready" reply."""

    def __init__(self, launcher: str, *, log_dir: str, argv: list[str] | None = None):
        self.launcher = launcher
        env = dict(os.environ)
        env["PYTHONPATH"] = REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
        env["NOTEBOOK_LAUNCH_LOG_DIR"] = os.path.join(log_dir, "rank-logs")
        self.stderr = tempfile.TemporaryFile(dir=log_dir)
        self.proc = subprocess.Popen(argv or [sys.executable, "-m", "benchmarks.worker", launcher],
                                     cwd=REPO_ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.stderr)
        assert self.proc.stdin is not None and self.proc.stdout is not None  # both pipes, as asked above
        self._commands: IO[bytes] = self.proc.stdin
        self._replies: IO[bytes] = self.proc.stdout
        self._buffer = b""
        self.ready: dict | None = None

    def wait_ready(self) -> dict:
        if self.ready is None:
            self.ready = self._reply()
            READY_STATES.append((self.launcher, self.ready))
        return self.ready

    def ask(self, **command) -> dict:
        self.wait_ready()
        self._commands.write((json.dumps(command) + "\n").encode())
        self._commands.flush()
        reply = self._reply()
        if "error" in reply:
            raise WorkerError(reply["error"])
        return reply

    def _reply(self) -> dict:
        deadline = time.monotonic() + REPLY_TIMEOUT
        fd = self._replies.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                self.close()
                raise WorkerError(f"{self.launcher} worker gave no answer in {REPLY_TIMEOUT:.0f} s")
            readable, _, _ = select.select([fd], [], [], left)
            if readable:
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise WorkerError(f"{self.launcher} worker exited: {self.stderr_tail()}")
                self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def stderr_tail(self, chars: int = 600) -> str:
        self.stderr.seek(0)
        return self.stderr.read().decode(errors="replace")[-chars:].strip()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self._commands.write(b'{"op": "exit"}\n')
                self._commands.flush()
                self.proc.wait(timeout=30)
            except Exception:
                self.proc.kill()
                self.proc.wait()
        self.stderr.close()


# --- the worker process -------------------------------------------------------

def _modules_state() -> dict:
    return {"torch._dynamo imported": "torch._dynamo" in sys.modules}


def handle(launcher: str, command: dict, tensors: dict) -> dict:
    from . import launchers, workloads
    op = command["op"]
    if op == "time":
        fn = workloads.WORKLOADS[command["workload"]]
        started = time.perf_counter()
        launchers.launch(launcher, fn, command["ranks"])
        seconds = time.perf_counter() - started
        return {"seconds": seconds, **_modules_state()}
    if op == "start_process_memory":   # item 13: the warm start process's resident memory
        from notebook_launch.engines.local import start_process
        return {"bytes": start_process.current().state()["resident_bytes"]}
    if op == "import_dynamo":   # the floor of a first training step in a fresh process
        started = time.perf_counter()
        import torch._dynamo  # noqa: F401
        import torch.nn.parallel  # noqa: F401
        return {"seconds": time.perf_counter() - started}
    if op == "memory":
        import torch
        mib = command["tensor_mib"]
        if mib not in tensors:
            tensors.clear()
            tensors[mib] = torch.ones(mib * 2**20 // 4, dtype=torch.float32)  # resident: written once
        probes = workloads.memory_probes(tensors[mib])
        return {kind: [r["uss"] for r in launchers.launch(launcher, probes[kind], command["ranks"],
                                                          start_method=command["start_method"])]
                for kind in command["kinds"]}
    if op == "iteration":
        return _iteration(launcher, command)
    if op == "persistent":
        from .persistent_cost import measure_in_worker as measure_persistent
        return measure_persistent(command["repeats"], command["width"])
    if op.startswith("anchor_persistent_"):   # item 15: start_ranks and warm calls, beside Monarch
        from . import anchors
        return anchors.in_worker(op, command)
    if op == "transfer":
        from .result_transfer import measure_in_worker as measure_transfer
        return measure_transfer(command, lambda fn, ranks: launchers.launch(launcher, fn, ranks))
    raise ValueError(f"unknown op {op!r}")


def _iteration(launcher: str, command: dict) -> dict:
    from . import launchers
    from .iteration_cost import loops_in_rank
    fn = loops_in_rank(command["iterations"], command["repeats"])
    return launchers.launch(launcher, fn, 1)[0]


def main(argv=None) -> None:
    launcher = (argv or sys.argv[1:])[0]
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    from . import launchers
    launchers.prepare(launcher)
    replies.write(json.dumps({"ready": True, **_modules_state()}) + "\n")
    tensors: dict[int, Any] = {}  # tensor_mib -> the one resident tensor of that size
    for line in sys.stdin:
        command = json.loads(line)
        if command.get("op") == "exit":
            break
        try:
            reply = handle(launcher, command, tensors)
        except NotImplementedError as exc:
            reply = {"not_available": f"{type(exc).__name__}: {exc}"}
        except BaseException as exc:
            reply = {"error": f"{type(exc).__name__}: {str(exc)[:300]}",
                     "traceback": traceback.format_exc()[-2000:]}
        replies.write(json.dumps(reply) + "\n")


if __name__ == "__main__":
    main()
