"""Shared by the benchmark modules: statistics, formatting, machine description."""
from __future__ import annotations

import datetime
import os
import platform
import socket
import statistics
import sys
from importlib import metadata

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def summary(samples):
    """(median, min, max) of a non-empty list of numbers."""
    return statistics.median(samples), min(samples), max(samples)


def fmt_value(value: float, unit: str) -> str:
    if unit == "s":
        if value < 0.01:
            return f"{value * 1000:.1f} ms"
        return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"
    if unit == "ns":
        return f"{value:.0f} ns"
    if unit == "MB":
        return f"{value:.1f} MB"
    return f"{value:.3g} {unit}"


def fmt_samples(samples, unit: str) -> str:
    """'median (min-max, n=5)', the form every timed cell of the table uses."""
    med, lo, hi = summary(samples)
    return f"{fmt_value(med, unit)} ({fmt_value(lo, unit)}–{fmt_value(hi, unit)}, n={len(samples)})"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def version_of(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_description() -> dict:
    """What a reader needs to judge the numbers: cores, memory, versions, date."""
    try:
        import psutil
        memory_gib = psutil.virtual_memory().total / 2**30
        load = ", ".join(f"{x:.2f}" for x in psutil.getloadavg())
    except Exception:  # psutil missing or unsupported platform
        memory_gib, load = float("nan"), "unknown"
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu_model(),
        "cores": f"{usable} usable of {os.cpu_count()}",
        "memory": f"{memory_gib:.1f} GiB",
        "load average at start": load,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "torch": version_of("torch"),
        "accelerate": version_of("accelerate"),
        "tqdm": version_of("tqdm"),
        "notebook_launch": version_of("notebook_launch"),
        "executable": sys.executable,
    }
