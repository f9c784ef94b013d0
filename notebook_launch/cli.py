"""``notebook-launch env | test | demo | clean``: what a launch would do here, whether it works, a
demo, and the run folders' cleanup.

The functions launched by ``test`` and ``demo`` live in this module (importable),
so they run with every start method, spawn included.
"""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from .errors import LaunchArgumentError, NotebookLaunchError

if TYPE_CHECKING:
    from .wire.plan import StartMethod

VERSIONED = ("torch", "accelerate", "ipywidgets", "ipykernel", "torch_xla", "torch_tpu", "libtpu", "lightning",
             "cloudpickle")


# --- env -----------------------------------------------------------------------

def package_version(name: str) -> str:
    """Installed version, read from metadata: never imports the package (torch_xla can crash on import)."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def launch_preview() -> dict[str, Any]:
    """What ``notebook_launcher(fn)`` would choose here, without starting anything: the
    launcher's own decision (``target.launch_target``), so the two cannot disagree."""
    from .planning.target import launch_target
    try:
        target = launch_target()
    except NotebookLaunchError as exc:   # e.g. a TPU whose layout is unknown
        from .detect.platform import detect
        where = detect()
        preview = _preview(where, where.describe(), "?", f"? ({exc})", "?")
        preview["tpu_stack"] = _tpu_stacks("?")
        return preview
    where = target.where
    gpus = target.device_count
    device = (f"{gpus} CUDA GPU(s)" if target.device_kind == "cuda"
              else "XLA" if target.device_kind == "xla" else "TPU (TorchTPU)" if target.device_kind == "tpu"
              else "CPU")
    preview = _preview(where, device, target.dist_backend, target.num_processes, target.start_method)
    preview["tpu_stack"] = _tpu_stacks(target.device_kind)
    return preview


def _tpu_stacks(device_kind: str) -> str:
    """Which TPU stack is installed (torch_tpu, torch_xla), and which a launch here would use."""
    from .detect import torch_tpu
    xla = package_version("torch_xla")
    return torch_tpu.describe_stacks(torch_tpu.detect_torch_tpu(), None if xla == "not installed" else xla,
                                     device_kind)


def _preview(where: Any, device: str, backend: str, ranks: Any, start: str) -> dict[str, Any]:
    from .display import choose_display
    from .planning.net import DEFAULT_PORT, port_is_free
    from .wire.plan import available_cpus
    return {
        "where": where.describe(),
        "device": device,
        "backend": backend,
        "start_method": start,
        "num_processes": ranks,
        "cpus": available_cpus(),
        "tpu": where.has_tpu,
        "evidence": ", ".join(where.evidence),
        "port": DEFAULT_PORT if port_is_free(DEFAULT_PORT) else f"{DEFAULT_PORT} busy: a free port is picked",
        "display": choose_display("auto").name,
    }


def cmd_env(args: argparse.Namespace) -> int:
    from . import __version__
    from .detect.platform import cuda_gpus
    preview = launch_preview()
    gpus = cuda_gpus()
    rows = [
        ("notebook_launch", __version__),
        ("where", preview["where"]),
        ("python", f"{platform.python_version()} ({sys.executable})"),
        ("system", f"{platform.system()} {platform.release()} {platform.machine()}"),
        ("cpus", str(preview["cpus"])),
        ("cuda gpus", ", ".join(f"{name} (driver {drv})" for name, drv in gpus) if gpus
         else preview["device"] if "CUDA" in preview["device"] else "none"),
        ("tpu", "yes" if preview["tpu"] else "none"),
        ("tpu stack", preview["tpu_stack"]),
    ]
    if preview["evidence"]:
        rows.insert(2, ("evidence", preview["evidence"]))
    rows += [(name, package_version(name)) for name in VERSIONED]
    from .engines import cluster_reports
    rows += cluster_reports()   # cluster=RayCluster(...) / SlurmCluster(...): what each would use
    print("\n".join(f"{key + ':':<17}{value}" for key, value in rows))
    print("\nA launch here would use:")
    print(f"  backend:        {preview['backend']} ({preview['device']})")
    print(f"  start method:   {preview['start_method']}")
    print(f"  num_processes:  {preview['num_processes']} by default (num_processes=None: one per GPU, "
          f"else 1; pass num_processes=N for N CPU ranks)")
    print(f"  port:           {preview['port']}")
    hint = "" if preview["display"] == "widget" else "; in a Jupyter notebook: the widget panel"
    print(f"  display:        {preview['display']} (ui='auto'{hint})")
    return 0


# --- test ----------------------------------------------------------------------

MARK = "notebook-launch-selftest"


def selftest_rank() -> dict[str, Any]:
    """What every rank of ``notebook-launch test`` does: init, collectives, output, result."""
    import torch
    import torch.distributed as dist
    dist.init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"{MARK} stdout from rank {rank}", flush=True)
    print(f"{MARK} stderr from rank {rank}", file=sys.stderr, flush=True)
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    gathered = [torch.zeros(1) for _ in range(world)]
    dist.all_gather(gathered, torch.tensor([float(rank * rank)]))
    dist.barrier()
    dist.destroy_process_group()
    return {"rank": rank, "world": world, "sum": total.item(),
            "gathered": [t.item() for t in gathered], "pid": os.getpid()}


def selftest_failing_rank(bad_rank: int) -> None:
    if int(os.environ["RANK"]) == bad_rank:
        raise RuntimeError(f"{MARK}: deliberate failure on rank {bad_rank}")
    import time
    time.sleep(60)  # the others wait: the launcher must stop them


def run_selftest(n: int, start_method: StartMethod | None = None, timeout: float = 180.0,
                 out: Callable[[str], Any] = print) -> list[str]:
    """Launch ``n`` ranks and return the failed checks (empty: everything works)."""
    from .errors import LaunchError
    from .launcher import notebook_launcher
    failures = []

    def check(ok: bool, what: str, detail: str = "") -> None:
        first, _, rest = (detail or "").partition("\n")
        out(f"  {'ok  ' if ok else 'FAIL'}  {what}" + (f": {first}" if first and not ok else ""))
        if not ok:
            if rest.strip():
                out("        " + rest.strip().replace("\n", "\n        "))
            failures.append(f"{what}: {first}" if first else what)

    log_dir = Path(tempfile.mkdtemp(prefix="notebook-launch-test-"))
    out(f"notebook-launch test: {n} rank(s), start_method={start_method or 'default'}")
    try:
        results = notebook_launcher(selftest_rank, num_processes=n, start_method=start_method,
                                    timeout=timeout, log_dir=str(log_dir), ui="none")
    except LaunchArgumentError:   # a usage error (main() reports it as one), not a fault of the machine
        shutil.rmtree(log_dir, ignore_errors=True)
        raise
    except Exception as exc:   # why: the self-test reports any failure as a failed check
        check(False, "launch", f"{type(exc).__name__}: {exc}")
        return failures
    check(isinstance(results, list) and len(results) == n, "one result per rank", repr(results)[:200])
    ranks = [r.get("rank") for r in results if isinstance(r, dict)]
    check(ranks == list(range(n)), "results in rank order", str(ranks))
    check(len({r["pid"] for r in results}) == n and os.getpid() not in {r["pid"] for r in results},
          "each rank is its own process")
    check(all(r["world"] == n for r in results), "world size", str([r["world"] for r in results]))
    expected_sum = n * (n + 1) / 2
    check(all(r["sum"] == expected_sum for r in results), "all_reduce",
          f"expected {expected_sum}, got {[r['sum'] for r in results]}")
    expected_gather = [float(r * r) for r in range(n)]
    check(all(r["gathered"] == expected_gather for r in results), "all_gather",
          f"expected {expected_gather}, got {[r['gathered'] for r in results]}")
    missing = []
    for rank in range(n):
        path = log_dir / f"rank{rank}.log"
        log = path.read_text(errors="replace") if path.exists() else ""
        if f"{MARK} stdout from rank {rank}" not in log or f"{MARK} stderr from rank {rank}" not in log:
            missing.append(rank)
    check(not missing, "output capture (stdout and stderr of every rank)", f"missing for ranks {missing}")
    bad = n - 1
    try:
        notebook_launcher(selftest_failing_rank, args=(bad,), num_processes=n, start_method=start_method,
                          timeout=timeout, log_dir=str(log_dir / "failure"), ui="none")
        check(False, "a failing rank raises LaunchError", "the launch returned normally")
    except LaunchError as exc:
        check(exc.rank == bad and "deliberate failure" in str(exc), "a failing rank raises LaunchError",
              f"rank={exc.rank}: {str(exc).splitlines()[0]}")
    except Exception as exc:   # why: the self-test reports any failure as a failed check
        check(False, "a failing rank raises LaunchError", f"{type(exc).__name__}: {exc}")
    if failures:
        out(f"  the ranks' logs are kept in {log_dir}")
    else:
        shutil.rmtree(log_dir, ignore_errors=True)
    return failures


def cmd_test(args: argparse.Namespace) -> int:
    failures = run_selftest(args.num_processes, args.start_method, args.timeout)
    if failures:
        print(f"\nFAILED: {len(failures)} check(s) failed: " + "; ".join(failures))
        print("Run `notebook-launch env` and include its output when reporting this.")
        return 1
    print(f"\nPASSED: {args.num_processes} rank(s) launched, communicated, reported results "
          f"and output; a failing rank was reported. notebook_launcher works here.")
    return 0


# --- demo ----------------------------------------------------------------------

def demo_train(steps: int = 300, lr: float = 0.05) -> dict[str, Any]:
    """DDP on synthetic regression data; each rank reads its own shard."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    dist.init_process_group()
    rank = dist.get_rank()
    torch.manual_seed(0)
    true_w = torch.tensor([[2.0], [-3.0], [0.5], [1.5]])
    model = DDP(torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(1000 + rank)
    loss = torch.tensor(0.0)
    from .rank.reports.progress import Progress
    bar = Progress(range(steps), total=steps, desc="train")
    for step in bar:
        x = torch.randn(64, 4, generator=gen)
        loss = torch.nn.functional.mse_loss(model(x), x @ true_w + 1.0)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 10 == 0 or step == steps - 1:
            bar.set_postfix(loss=loss.item())
    dist.barrier()
    weights = torch.cat([p.detach().flatten() for p in model.module.parameters()])
    dist.destroy_process_group()   # safe with the model alive: see notebook_launch.rank.group.process_groups
    return {"rank": rank, "loss": loss.item(), "weights": weights}


def cmd_demo(args: argparse.Namespace) -> int:
    import torch
    from .launcher import notebook_launcher
    results = notebook_launcher(demo_train, args=(args.steps,), num_processes=args.num_processes,
                                start_method=args.start_method, ui=args.ui, timeout=args.timeout)
    for r in results:
        print(f"rank {r['rank']}: final loss {r['loss']:.4f}")
    same = all(torch.equal(results[0]["weights"], r["weights"]) for r in results)
    print("every rank holds the same weights" if same else "ranks DIVERGED")
    return 0 if same else 1


# --- clean -----------------------------------------------------------------------

def cmd_clean(args: argparse.Namespace) -> int:
    """Remove run folders: by the retention rule (no option), or as the options say; a live
    run's folder is never removed. Prints each folder removed and what it freed."""
    from .record.run_folders import (MEGABYTE, Retention, list_run_folders, live_pid, remove,
                              retention_from_environment, select_for_removal)
    root = Path(args.dir).expanduser()
    folders = list_run_folders(root)
    chosen_by_option = args.all or args.keep is not None or args.max_mb is not None or args.older_than is not None
    if args.all:
        retention: Retention | None = Retention(0, 0)
    elif args.keep is not None or args.max_mb is not None:
        default = retention_from_environment()
        retention = Retention(default.keep_runs if args.keep is None else args.keep,
                              default.keep_bytes if args.max_mb is None else int(args.max_mb * MEGABYTE))
    elif args.older_than is not None:
        retention = None
    else:
        retention = retention_from_environment()
    older_than = None if args.older_than is None else args.older_than * 86400
    chosen = select_for_removal(folders, retention, older_than)
    verb = "would remove" if args.dry_run else "removed"
    done = chosen if args.dry_run else remove(chosen)
    for folder in done:
        written = time.strftime("%Y-%m-%d %H:%M", time.localtime(folder.last_written))
        print(f"{verb} {folder.path}  {_megabytes(folder.size)}  (last written {written})")
    gone = {folder.path for folder in done}
    kept = [folder for folder in folders if folder.path not in gone]
    live = [(folder, live_pid(folder.path)) for folder in kept]
    live = [(folder, pid) for folder, pid in live if pid is not None]
    for folder, pid in live:
        print(f"kept {folder.path}: a run still going" + (f" (pid {pid})" if pid else ""))
    rule = "" if chosen_by_option else f" (the retention rule: {retention_from_environment().describe()})"
    print(f"{verb.capitalize()} {len(done)} run folder(s) under {root}, "
          f"{'would free' if args.dry_run else 'freed'} {_megabytes(sum(f.size for f in done))}; "
          f"{len(kept)} kept ({_megabytes(sum(f.size for f in kept))}), {len(live)} of them live{rule}")
    return 0


def _megabytes(size: int) -> str:
    """Sizes as people read them: 12 kB, 3.4 MB, 1.2 GB."""
    if size < 10**6:
        return f"{size / 10**3:.0f} kB"
    return f"{size / 10**6:.1f} MB" if size < 10**9 else f"{size / 10**9:.1f} GB"


# --- entry -----------------------------------------------------------------------

class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help ends with its default (argparse's formatter), unless the help already
    says it in words (a default of None means "decided at run time" and says how)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "default" in text or action.default is argparse.SUPPRESS or action.option_strings == ["-h", "--help"]:
            return text
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    from .display import UI_CHOICES
    from .record.run_folders import KEEP_MB_VARIABLE, KEEP_RUNS_VARIABLE, default_log_root, retention_from_environment
    parser = argparse.ArgumentParser(
        prog="notebook-launch", description="Check and try notebook_launch on this machine.",
        formatter_class=_HelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="{env,test,demo,clean}")
    sub.required = True

    def command(name: str, text: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=text, description=text, formatter_class=_HelpFormatter)

    p_env = command("env", "where we run, devices, versions, and what a launch would do")
    p_env.set_defaults(func=cmd_env)
    p_test = command("test", "launch N ranks and check collectives, results and output")
    p_test.add_argument("-n", "--num-processes", type=_positive_int, default=2, help="ranks to launch")
    p_test.add_argument("--start-method", choices=("fork", "spawn"), default=None,
                        help="how ranks start (default: the launcher's choice, fork where it can)")
    p_test.add_argument("--timeout", type=_seconds, default=180.0, help="seconds per launch")
    p_test.set_defaults(func=cmd_test, parser=p_test)
    p_demo = command("demo", "train a small model on synthetic data across ranks, with the panel")
    p_demo.add_argument("-n", "--num-processes", type=_positive_int, default=2, help="ranks to train on")
    p_demo.add_argument("--steps", type=_positive_int, default=300, help="training steps on every rank")
    p_demo.add_argument("--start-method", choices=("fork", "spawn"), default=None,
                        help="how ranks start (default: the launcher's choice, fork where it can)")
    p_demo.add_argument("--ui", default="auto", choices=UI_CHOICES, help="how the run is shown")
    p_demo.add_argument("--timeout", type=_seconds, default=None,
                        help="seconds before the ranks are stopped (default: none, as long as the run needs)")
    p_demo.set_defaults(func=cmd_demo, parser=p_demo)
    try:
        rule = retention_from_environment()
    except LaunchArgumentError:   # reported when clean runs; the help still shows
        from .record.run_folders import Retention
        rule = Retention()
    p_clean = command("clean", "remove the folders of earlier runs' logs (a live run's folder is never removed)")
    p_clean.description = (
        f"Remove run folders under the log root. With no option: the retention rule every run applies "
        f"as it starts ({rule.describe()}; {KEEP_RUNS_VARIABLE} and {KEEP_MB_VARIABLE} change it). "
        f"Options combine: a folder goes if any says so. The folder of a run still going is never removed.")
    p_clean.add_argument("--dir", default=str(default_log_root()),
                         help="the log root of the run folders: $NOTEBOOK_LAUNCH_LOG_DIR if set, else the user cache")
    p_clean.add_argument("--keep", type=_count, default=None, metavar="N",
                         help=f"keep the newest N runs (default: {rule.keep_runs}, the retention rule's)")
    p_clean.add_argument("--max-mb", type=_megabytes_argument, default=None, metavar="MB",
                         help=f"keep the newest runs that fit in MB megabytes together "
                              f"(default: {rule.keep_bytes / 10**6:g}, the retention rule's)")
    p_clean.add_argument("--older-than", type=_days, default=None, metavar="DAYS",
                         help="remove the runs last written more than DAYS days ago (default: none by age)")
    p_clean.add_argument("--all", action="store_true", help="remove every run folder but live ones")
    p_clean.add_argument("--dry-run", action="store_true", help="print what would be removed, remove nothing")
    p_clean.set_defaults(func=cmd_clean, parser=p_clean)
    return parser


def _number_at_least(kind: type, minimum: float, what: str) -> Callable[[str], Any]:
    """An argparse type: ``kind`` (int or float) parsed from the text, finite and >= ``minimum``,
    or an error that says ``what`` it must be."""
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not minimum <= value < float("inf"):
            raise argparse.ArgumentTypeError(f"must be {what}; got {text!r}")
        return value
    return parse


_count = _number_at_least(int, 0, "a whole number >= 0")
_megabytes_argument = _number_at_least(float, 0, "a number of megabytes >= 0")
_days = _number_at_least(float, 0, "a number of days >= 0")
_positive_int = _number_at_least(int, 1, "a whole number >= 1")


def _seconds(text: str) -> float:
    """A finite number of seconds > 0 ("nan", "inf", "-5" and "0" are usage errors)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0; got {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    """Usage errors (also a LaunchArgumentError from the launch a command makes) exit 2 with
    argparse's usage line, never a traceback or a report of a broken machine."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except LaunchArgumentError as err:
        parser = getattr(args, "parser", None) or build_parser()
        parser.error(str(err))   # exits 2
        return 2   # (not reached: error() exits)
