"""fork_locks.ForkRenewedLock: a process forked while another thread held one of our locks can take
it at once (the lock is renewed in the child), while a lock the forking thread held stays held
until that thread releases it. Every module-level lock of the package is one (a scan of the
modules), so the next lock a module adds meets the same rule: the class is tested, not one lock."""
from __future__ import annotations

import importlib
import os
import pkgutil
import subprocess
import sys
import threading

import notebook_launch

CHILD_TAKES_A_LOCK_ANOTHER_THREAD_HELD = """
import os, signal
from helpers.forking import hold_in_another_thread
from notebook_launch.wire.fork_locks import ForkRenewedLock

lock = ForkRenewedLock()
hold_in_another_thread(lock)
pid = os.fork()
if pid == 0:
    signal.alarm(10)   # a plain threading.Lock: waits for a thread this process does not have
    with lock:
        pass
    os._exit(0)
_, status = os.waitpid(pid, 0)
print("CHILD", os.waitstatus_to_exitcode(status), "PARENT STILL HELD", lock.locked())
"""

FORKING_THREAD_KEEPS_ITS_LOCK = """
import os, threading
from notebook_launch.wire.fork_locks import ForkRenewedLock

lock = ForkRenewedLock()
with lock:
    pid = os.fork()
    if pid == 0:
        taken = []
        other = threading.Thread(target=lambda: taken.append(lock._lock.acquire(timeout=0.5)))
        other.start()
        other.join()
        # still ours in the child: another child thread could not take it while we are inside
        code = 0 if taken == [False] else 3
if pid == 0:
    with lock:   # released by the with block above, as in the parent; taken again at once
        pass
    os._exit(code)
_, status = os.waitpid(pid, 0)
print("CHILD", os.waitstatus_to_exitcode(status))
"""


def run(script: str) -> str:
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          cwd=os.path.dirname(os.path.abspath(__file__)))   # for helpers.forking
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_child_forked_while_another_thread_holds_the_lock_takes_it_at_once():
    assert "CHILD 0 PARENT STILL HELD True" in run(CHILD_TAKES_A_LOCK_ANOTHER_THREAD_HELD)


def test_a_lock_the_forking_thread_holds_stays_held_in_the_child_until_it_releases_it():
    assert "CHILD 0" in run(FORKING_THREAD_KEEPS_ITS_LOCK)


def test_every_module_level_lock_of_the_package_is_renewed_in_forked_children():
    plain = (type(threading.Lock()), type(threading.RLock()))
    found = []
    for info in pkgutil.walk_packages(notebook_launch.__path__, "notebook_launch."):
        try:
            module = importlib.import_module(info.name)
        except ImportError:   # optional extras (torch_xla) where they are not installed
            continue
        found += [f"{info.name}.{name}" for name, value in vars(module).items() if isinstance(value, plain)]
    assert found == [], f"module-level locks a forked child could inherit held: {found}; use ForkRenewedLock"

