"""One node of a multi-node test: run notebook_launcher as a user would on that
node, then write what happened (results or the LaunchError) as JSON.

Usage: python node_script.py CONFIG.json   (the config names the output file)
"""
import json
import os
import signal
import sys
import time

HANDLED = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT")


def train(scenario):
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    print(f"rank {rank} of {world}: sum {total.item():g} (attempt {attempt})", flush=True)
    if scenario == "fail":
        if rank == 3:
            raise ValueError("boom on rank 3")
        time.sleep(120)   # only the launcher can end these ranks in time
    if scenario == "sleep":
        time.sleep(120)   # until the test interrupts a node
    if scenario == "hang":
        if rank == 3:   # skips the next all_reduce (an evaluation only it runs): the others wait in it
            time.sleep(120.0)
        dist.all_reduce(torch.ones(1))
    if scenario == "restart":
        if rank == 3 and attempt == 0:
            raise ValueError("injected failure on attempt 0")
        check = torch.ones(1)
        dist.all_reduce(check)   # the ranks of attempt 0 wait here when rank 3 fails
        total += check - world
    if scenario == "resources":   # held until this node's notebook showed the rank's own memory
        seen = os.path.join(os.environ["NODE_SCRIPT_SEEN"], f"rank{rank}")
        deadline = time.monotonic() + 120
        while not os.path.exists(seen) and time.monotonic() < deadline:
            time.sleep(0.05)
    dist.destroy_process_group()
    from notebook_launch.rank.reports import resources
    return {"self_sampling": resources.current() is not None,
            "rank": rank, "world_size": world, "local_rank": int(os.environ["LOCAL_RANK"]),
            "node_rank": int(os.environ["GROUP_RANK"]), "sum": total.item(), "attempt": attempt,
            "gloo_ifname": os.environ.get("GLOO_SOCKET_IFNAME"),
            "nccl_ifname": os.environ.get("NCCL_SOCKET_IFNAME")}


def main():
    with open(sys.argv[1]) as f:
        cfg = json.load(f)
    from notebook_launch import LaunchError, notebook_launcher

    if cfg["scenario"] == "resources":
        _tell_ranks_when_seen(cfg["log_dir"] + "-seen")
    before = {name: signal.getsignal(getattr(signal, name)) for name in HANDLED}
    _warm_tcpstore()
    fds_before = _open_fds()
    started = time.monotonic()
    out = {"node_rank": cfg["node_rank"]}
    try:
        out["results"] = notebook_launcher(
            train, args=(cfg["scenario"],), num_processes=2, num_nodes=2,
            node_rank=cfg["node_rank"], master_addr=cfg["master_addr"], use_port=str(cfg["port"]),
            rdzv_backend=cfg.get("rdzv_backend", "static"), rdzv_endpoint=cfg.get("rdzv_endpoint", ""),
            rdzv_id=cfg.get("rdzv_id", "none"), max_restarts=cfg.get("max_restarts", 0),
            rdzv_timeout=cfg.get("rdzv_timeout", 60), log_dir=cfg["log_dir"], ui="text",
            timeout=cfg.get("timeout"))
        out["ok"] = True
    except LaunchError as exc:
        out.update(ok=False, message=str(exc), rank=exc.rank, error_node=exc.node_rank, kind=exc.kind,
                   exc_type=exc.exc_type)
    except KeyboardInterrupt as exc:
        out.update(ok=False, interrupted=True, message=str(exc))
    out["seconds"] = time.monotonic() - started
    after = {name: signal.getsignal(getattr(signal, name)) for name in HANDLED}
    out["handlers_restored"] = before == after
    out["children_left"] = _children()
    # less the keeper's socket, which the first launch opens for the process's life (leftovers)
    from notebook_launch.process.leftovers import keeper_fds
    keepers = {str(fd) for fd in keeper_fds()}
    out["fds_left"] = sorted(fd for fd in set(_open_fds()) - set(fds_before) if fd.split("->")[0] not in keepers)
    with open(cfg["output"], "w") as f:
        json.dump(out, f)


def _tell_ranks_when_seen(folder):
    """Observes only: a file per rank in ``folder`` once this node's panel shows the rank's own
    memory (read by this node from the rank's /proc), so the rank may end."""
    import notebook_launch.supervise.resources as sampling
    os.makedirs(folder, exist_ok=True)
    os.environ["NODE_SCRIPT_SEEN"] = folder   # the ranks inherit it
    publish = sampling.ResourceSampler.publish

    def publish_and_tell(self, state, logs, now=None):
        publish(self, state, logs, now)
        for rs in state.ranks:
            if rs.resources is not None and rs.resources.uss is not None:
                open(os.path.join(folder, f"rank{rs.rank}"), "w").close()

    sampling.ResourceSampler.publish = publish_and_tell   # type: ignore[method-assign]  # observes, then publishes


def _warm_tcpstore():
    """torch keeps one pipe open for good after its first TCPStore server: open it
    now, so the fd check below sees only what the launch itself left behind."""
    import datetime

    from torch.distributed import TCPStore
    store = TCPStore("127.0.0.1", 0, 1, True, datetime.timedelta(seconds=5), wait_for_workers=False)
    del store


def _open_fds():
    return [f"{fd}->{_target(fd)}" for fd in os.listdir("/proc/self/fd")]


def _target(fd):
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return "?"


def _children():
    try:
        import psutil
        return [p.pid for p in psutil.Process().children(recursive=True)]
    except Exception as exc:  # pragma: no cover
        return [f"unknown: {exc}"]


if __name__ == "__main__":
    main()
