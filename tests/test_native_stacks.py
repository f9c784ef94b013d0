"""py-spy's native frames in a hang's detail (issue 20, ``diagnose.native_stacks``): a rank
blocked in C (a gloo wait, a sleep) shows the C/C++ frames under its Python line when py-spy is
installed; without py-spy nothing changes. Real processes and a real py-spy (the ``test`` extra)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from notebook_launch import LaunchError, notebook_launcher
from notebook_launch.planning.net import free_port
from notebook_launch.diagnose import native_stacks

needs_py_spy = pytest.mark.skipif(native_stacks.py_spy() is None, reason="py-spy is not installed (pip install py-spy)")
SLEEPER = "import time; print('ready', flush=True); time.sleep(600)"


@pytest.fixture
def sleeper():
    """A Python process blocked in time.sleep (in C: clock_nanosleep)."""
    proc = subprocess.Popen([sys.executable, "-c", SLEEPER], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


@needs_py_spy
def test_the_native_frames_under_a_sleep(sleeper):
    frames = native_stacks.native_frames({3: sleeper})
    lines = frames[3].splitlines()
    assert any(line.startswith("time_sleep (libpython") or line.startswith("time_sleep (python")
               for line in lines), lines
    assert any(line.startswith("clock_nanosleep (libc") for line in lines), lines
    assert not any("<string>" in line for line in lines)   # the Python frame is the stack's, not repeated


def test_without_py_spy_nothing_changes(sleeper, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(sys, "executable", "/nonexistent/python")
    assert native_stacks.py_spy() is None
    assert native_stacks.native_frames({0: sleeper}) == {}
    assert native_stacks.beyond_python([(0, sleeper)], lambda filename: None) == {}


def test_a_cpp_frame_is_shortened():
    frame = ("pybind11::cpp_function::initialize<pybind11::cpp_function::cpp_function<bool, c10d::Work, "
             "std::chrono::duration<long, std::ratio<1l, 1000l> > > >(bool (c10d::Work::*)(std::chrono::duration"
             "<long, std::ratio<1l, 1000l> >))::{lambda(c10d::Work*)#1}::_FUN (libtorch_python.so)")
    short = native_stacks.short_frame(frame)
    assert short.startswith("pybind11::cpp_function::initialize<>") and len(short) <= native_stacks.FRAME_WIDTH
    dump = ('Process 1: python x.py\nPython v3.11.7\n\nThread 1 (idle): "MainThread"\n'
            "    pthread_cond_wait (libc.so.6)\n    c10d::Work::wait (libtorch_cpu.so)\n"
            "    all_reduce (torch/distributed/distributed_c10d.py:3252)\n    <module> (x.py:4)\n"
            'Thread 7 (idle): "Thread-1"\n    epoll_wait (libc.so.6)\n')
    assert native_stacks.main_thread_text(dump, 1) == \
        "c10d::Work::wait (libtorch_cpu.so)\npthread_cond_wait (libc.so.6)"


def rank_0_waits_in_all_reduce():
    import time

    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        time.sleep(600)
    dist.all_reduce(torch.ones(1))


@needs_py_spy
def test_a_timeout_shows_the_native_frames_of_a_rank_in_a_gloo_wait(log_dir):
    with pytest.raises(LaunchError) as info:
        notebook_launcher(rank_0_waits_in_all_reduce, num_processes=2, timeout=25, log_dir=log_dir, ui="text",
                          use_port=str(free_port()))
    text = str(info.value)
    rank0 = text[text.index("rank 0:"):text.index("rank 1:")]
    native = rank0[rank0.index("native frames of its main thread (py-spy, most recent call last):"):]
    assert "c10d::" in native   # the gloo work the rank waits for, which the Python stack cannot show
    rank1 = text[text.index("rank 1:"):]
    assert "clock_nanosleep" in rank1
    assert os.path.isdir(log_dir)
