"""Count hangs of the DDP + destroy_process_group(); return pattern under several launchers.

Not a test (slow, statistical): the regression test is tests/test_gloo_teardown.py.
    .venv/bin/python tests/manual/repro_gloo_teardown.py ours -n 40 --timeout 15
Variants: ours (notebook_launcher), ours-nowarm (no torch._dynamo import in the parent),
tmp / tmp-dynamo (bare torch.multiprocessing.start_processes fork, without/with torch._dynamo
imported in the parent), accel / accel-dynamo (accelerate.notebook_launcher, same split).
To test main without the fix: PYTHONPATH=<a checkout of main> from another directory.
"""
import argparse
import os
import sys
import time
import socket
import signal

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def train(steps=5):
    dist.init_process_group("gloo")
    model = DDP(torch.nn.Linear(3, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        loss = model(torch.randn(8, 3)).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.destroy_process_group()
    return 1


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def tmp_rank(i, world, port, steps):
    os.environ.update(RANK=str(i), LOCAL_RANK=str(i), WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    train(steps)


def run_tmp(world, steps, timeout):
    import torch.multiprocessing as mp
    port = free_port()
    ctx = mp.start_processes(tmp_rank, args=(world, port, steps), nprocs=world, join=False,
                             start_method="fork")
    deadline = time.monotonic() + timeout
    while not ctx.join(timeout=max(0.1, deadline - time.monotonic())):
        if time.monotonic() > deadline:
            pids = [p.pid for p in ctx.processes if p.is_alive()]
            if os.environ.get("KEEP_STUCK"):
                print("STUCK pids", pids, flush=True)
                time.sleep(float(os.environ["KEEP_STUCK"]))
            for p in ctx.processes:
                if p.is_alive():
                    os.kill(p.pid, signal.SIGKILL)
            for p in ctx.processes:
                p.join()
            return "hang"
    return "ok"


def run_ours(world, steps, timeout):
    from notebook_launch import notebook_launcher, LaunchError
    try:
        notebook_launcher(train, args=(steps,), num_processes=world, timeout=timeout, ui="none")
        return "ok"
    except LaunchError as e:
        return "hang" if "timed out" in str(e) else "error: " + str(e)[:200]


def run_accel(world, steps, timeout):
    # accelerate's notebook_launcher has no timeout: run each launch in a child process we can kill
    import multiprocessing
    def target():
        from accelerate import notebook_launcher as acc
        acc(train, args=(steps,), num_processes=world, use_port=str(free_port()))
    p = multiprocessing.get_context("fork").Process(target=target)
    p.start()
    p.join(timeout)
    if p.is_alive():
        import subprocess
        subprocess.run(["pkill", "-9", "-P", str(p.pid)])   # the ranks of this one launch
        p.kill()
        p.join()
        return "hang"
    return "ok" if p.exitcode == 0 else f"error rc {p.exitcode}"


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("variant", choices=["ours", "ours-nowarm", "tmp", "tmp-dynamo", "accel", "accel-dynamo"])
    ap.add_argument("-n", type=int, default=30)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=60)
    a = ap.parse_args()
    if a.variant == "ours-nowarm":
        import notebook_launch.engines.local.fork as fk
        def no_warm(function, say=lambda text: None) -> None:
            pass
        fk.warm_for = no_warm
    if a.variant in ("tmp-dynamo", "accel-dynamo"):
        import torch._dynamo  # noqa
        import torch.nn.parallel  # noqa
    fn = {"ours": run_ours, "ours-nowarm": run_ours, "tmp": run_tmp, "tmp-dynamo": run_tmp,
          "accel": run_accel, "accel-dynamo": run_accel}[a.variant]
    counts: dict[object, int] = {}   # each outcome of a run -> how many runs ended so
    t0 = time.time()
    for i in range(a.n):
        r = fn(2, a.steps, a.timeout)
        counts[r] = counts.get(r, 0) + 1
        print(i, r, flush=True)
    print(a.variant, counts, f"{time.time()-t0:.0f}s", "dynamo in parent:", "torch._dynamo" in sys.modules)
