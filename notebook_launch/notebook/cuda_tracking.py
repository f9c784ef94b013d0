"""CUDA in the notebook's own process: has it been initialized, or has the CUDA
runtime been asked anything that makes a forked rank's CUDA unusable (a "poisoned"
fork), and which line or cell did it, so the guards can refuse and say where.

Two ways a notebook spoils fork for CUDA:

* CUDA initialized (``.cuda()``, a CUDA tensor, an Accelerator): ``torch.cuda.is_initialized()``.
* The CUDA runtime counted devices without a context: ``torch.cuda.is_available()``
  (without ``PYTORCH_NVML_BASED_CUDA_CHECK=1``), ``torch.cuda.device_count()`` when NVML
  cannot answer, or another library calling ``cuInit``. torch's ``_cuda_getDeviceCount``
  calls ``poison_fork()``, which registers a ``pthread_atfork`` handler marking every later
  child "in bad fork"; ``is_initialized()`` stays False, and each forked rank dies in
  ``torch.cuda.set_device`` with "Cannot re-initialize CUDA in forked subprocess" (torch's
  docs: "multiprocessing-poison-fork-note"; ``torch/cuda/__init__.py``). The mark lives only
  in the children, so ``fork_is_poisoned`` asks a throwaway child; the CUDA driver itself
  says whether ``cuInit`` ran here (``cuDeviceGetCount`` answers CUDA_ERROR_NOT_INITIALIZED
  until it did), which also covers libraries other than torch.

Witnesses of where: wrappers around ``torch.cuda._lazy_init`` and ``torch._C._cuda_getDeviceCount``
(the Python stack of the first call after ``install()``), and an IPython post-run-cell hook
(the first cell after which CUDA was initialized or the runtime was asked, which also catches
calls the wrappers cannot see). ``install()`` runs from ``hooks.install()``: on
``%load_ext notebook_launch``, ``notebook_launch.install_hooks()`` or the first launch, never on
``import notebook_launch``. The launch guards work without it, they just cannot say where;
CUDA already initialized when it is installed is remembered as "before tracking began"
(``initialized_before_tracking``), so no later cell is blamed for it.

Our own device count (``count_gpus_without_poisoning``) never asks the CUDA runtime in this
process: NVML, else a throwaway child.
"""
from __future__ import annotations

import ctypes
import importlib.util
import logging
import os
import re
import sys
import traceback
from typing import Any, Callable

from ..errors.ipython_shell import running_shell

log = logging.getLogger("notebook_launch")
_first_init_stack: list | None = None
_first_cell: tuple | None = None    # (execution_count, first lines of the cell)
_first_count_stack: list | None = None   # the first call that asked the CUDA runtime to count
_first_count_cell: tuple | None = None
_count_calls = 0                     # calls of the runtime's device count seen by the wrapper
NVML_CHECK_VARIABLE = "PYTORCH_NVML_BASED_CUDA_CHECK"
CUDA_ERROR_NOT_INITIALIZED = 3
_installed = False
_initialized_before_tracking = False   # CUDA was initialized before install(): where is unknown


def install() -> None:
    """Idempotent (called by ``hooks.install``). Each call wraps what torch offers by then
    (torch may be imported after the first call: never imported here, so a process that does
    not use torch never pays for it; in IPython the cell that imports it is the witness, and
    the wrappers are in place from the next cell on); the IPython hook is registered once,
    only where a shell runs."""
    global _installed, _initialized_before_tracking
    if _first_init_stack is None and _first_cell is None and is_cuda_initialized():
        _initialized_before_tracking = True
    _wrap_lazy_init()
    _wrap_runtime_device_count()
    if _installed:
        return
    _installed = True
    _register_ipython_hook()


def _wrap_lazy_init() -> None:
    torch = sys.modules.get("torch")
    if torch is None:
        return
    cuda = torch.cuda
    original = cuda._lazy_init
    if getattr(original, "_notebook_launch_wrapped", False):
        return

    def _lazy_init(*args: Any, **kwargs: Any) -> Any:
        global _first_init_stack
        if _first_init_stack is None and not cuda.is_initialized():
            _first_init_stack = traceback.extract_stack()[:-1]
        return original(*args, **kwargs)

    _lazy_init._notebook_launch_wrapped = True  # type: ignore[attr-defined]
    cuda._lazy_init = _lazy_init


def _wrap_runtime_device_count() -> None:
    """Record the first call of ``torch._C._cuda_getDeviceCount``: the call that poisons fork.
    ``torch.cuda.is_available()`` and ``device_count()`` look it up on ``torch._C`` at every
    call, so the wrapper sees theirs."""
    torch = sys.modules.get("torch")
    if torch is None:
        return
    original = getattr(torch._C, "_cuda_getDeviceCount", None)
    if original is None or getattr(original, "_notebook_launch_wrapped", False):
        return   # a CPU build: nothing there can poison fork

    def _cuda_getDeviceCount(*args: Any, **kwargs: Any) -> Any:
        global _first_count_stack, _count_calls
        _count_calls += 1
        if _first_count_stack is None and not is_cuda_initialized():
            _first_count_stack = traceback.extract_stack()[:-1]
        return original(*args, **kwargs)

    _cuda_getDeviceCount._notebook_launch_wrapped = True  # type: ignore[attr-defined]
    _cuda_getDeviceCount.__wrapped__ = original  # type: ignore[attr-defined]
    torch._C._cuda_getDeviceCount = _cuda_getDeviceCount


def _register_ipython_hook() -> None:
    """Only into a shell that runs: a plain Python process has no cells (and is not made to
    import IPython to learn that)."""
    shell = running_shell()
    if shell is None:
        return

    def _after_cell(result: Any) -> None:
        global _first_cell, _first_count_cell
        torch = sys.modules.get("torch")
        if torch is None or (_first_cell is not None and _first_count_cell is not None):
            return
        info = getattr(result, "info", None)
        source = getattr(info, "raw_cell", "") or ""
        here = (getattr(result, "execution_count", None), likely_culprits(source))
        if _first_cell is None and not _initialized_before_tracking and is_cuda_initialized():
            _first_cell = here
        if _first_count_cell is None and _count_calls:
            _first_count_cell = here
        _wrap_lazy_init()   # torch imported by this cell: later cells' calls are seen by line
        _wrap_runtime_device_count()

    shell.events.register("post_run_cell", _after_cell)


_CUDA_HINT = re.compile(r"cuda|\.to\(|device|Accelerator|PartialState|is_available", re.IGNORECASE)


def likely_culprits(source: str, limit: int = 3) -> list[str]:
    """The lines of a cell most likely to have touched CUDA, else its first lines."""
    lines = [line for line in source.strip().splitlines() if line.strip()]
    hits = [line for line in lines if _CUDA_HINT.search(line)]
    return (hits or lines)[:limit]


def is_cuda_initialized() -> bool:
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        return bool(torch.cuda.is_initialized())
    except Exception:   # why: a torch.cuda that cannot answer is taken as not started here
        log.debug("torch.cuda.is_initialized() failed; assuming CUDA is not initialized", exc_info=True)
        return False


def tracking() -> bool:
    """Whether install() has run in this process (where CUDA gets initialized is being recorded)."""
    return _installed


def initialized_before_tracking() -> bool:
    """CUDA was already initialized when install() ran, so where is not known."""
    return _initialized_before_tracking


def runtime_asked_before_tracking() -> bool:
    """The wrapper of the runtime's device count never saw a call: whatever asked it did so
    before install() (or below Python, where no wrapper sees it)."""
    return _count_calls == 0


def where() -> str:
    """Human description of where CUDA was first initialized, or '' if unknown."""
    return _describe(_first_init_stack, _first_cell, "CUDA was first initialized at:",
                     "CUDA was already initialized after running cell")


def where_runtime_was_asked() -> str:
    """Human description of where the CUDA runtime was first asked to count devices
    (what poisons fork), or '' if unknown."""
    return _describe(_first_count_stack, _first_count_cell,
                     "The CUDA runtime was first asked for the device count at:",
                     "The CUDA runtime had been asked for the device count after running cell")


def _describe(stack: list | None, cell: tuple | None, stack_words: str, cell_words: str) -> str:
    parts = []
    if stack:
        user_frames = [f for f in stack if not _is_library_frame(f.filename)]
        frames = user_frames[-3:] or stack[-3:]
        parts.append(stack_words + "\n" + "".join(traceback.format_list(frames)).rstrip())
    if cell is not None:
        count, lines = cell
        snippet = "\n".join("    " + line for line in lines)
        parts.append(f"{cell_words} [{count}]:\n{snippet}")
    return "\n".join(parts)


def _is_library_frame(filename: str) -> bool:
    return any(marker in filename for marker in ("site-packages", "dist-packages", "/torch/",
                                                 "notebook_launch", "IPython", "ipykernel",
                                                 "<frozen", "/lib/python3"))


# --- fork safety: asked without touching the CUDA runtime here -------------------------

def cuda_build(torch: Any) -> bool:
    """torch was built with CUDA: only then can anything in it poison fork."""
    return bool(getattr(getattr(torch, "version", None), "cuda", None)) \
        and hasattr(torch._C, "_cuda_getDeviceCount")


def fork_is_poisoned() -> bool:
    """True when ranks forked from this process now would find CUDA unusable although
    ``torch.cuda.is_initialized()`` is False: the CUDA driver was initialized here (by torch's
    runtime device count or another library), or torch marked fork as poisoned. Costs one
    short fork on a CUDA build of torch; nothing at all without one."""
    torch = sys.modules.get("torch")
    if torch is None or not cuda_build(torch):
        return False
    if cuda_driver_initialized():
        return True
    return bool(in_throwaway_child(lambda: int(bool(torch.cuda._is_in_bad_fork()))))


def cuda_driver_initialized(maps_path: str = "/proc/self/maps",
                            load: Callable[[str], Any] = ctypes.CDLL) -> bool:
    """Did anything in this process call ``cuInit`` (which no forked child survives)?
    A process that never loaded libcuda cannot have; one that did asks the driver's
    ``cuDeviceGetCount``, which answers CUDA_ERROR_NOT_INITIALIZED until ``cuInit`` ran and
    initializes nothing itself. ``maps_path`` and ``load`` let tests describe a driver."""
    try:
        with open(maps_path, encoding="utf-8", errors="replace") as f:
            libraries = [line.split()[-1] for line in f if "libcuda.so" in line]
    except OSError:
        log.debug("cannot read %s; not asking the CUDA driver", maps_path, exc_info=True)
        return False
    if not libraries:
        return False
    try:
        driver = load(libraries[0])
        count = ctypes.c_int(0)
        return int(driver.cuDeviceGetCount(ctypes.byref(count))) != CUDA_ERROR_NOT_INITIALIZED
    except (OSError, AttributeError):
        log.debug("cannot ask the loaded CUDA driver whether it is initialized", exc_info=True)
        return False


def count_gpus_without_poisoning() -> int:
    """GPUs visible to this process, found without leaving fork unusable: torch's NVML count
    (what ``torch.cuda.device_count()`` tries first, honouring CUDA_VISIBLE_DEVICES); where
    NVML cannot answer (no libnvidia-ml, MIG UUIDs), torch's own count asked in a throwaway
    child, since asking the CUDA runtime here would poison every later fork."""
    if "torch" not in sys.modules and not installed_torch_names_cuda():
        return 0   # no CUDA build of torch installed: nothing to count with, no torch to import
    try:
        import torch
    except ImportError:
        log.debug("torch is not importable: counting no GPU")
        return 0
    if not cuda_build(torch):
        return 0
    try:
        if torch.cuda.is_initialized():   # nothing left to spoil: the runtime is in use here
            return int(torch.cuda.device_count())
        nvml = getattr(torch.cuda, "_device_count_nvml", None)
        count = int(nvml()) if nvml is not None else -1
    except Exception:   # why: NVML is optional: the count then comes from the other sources below
        log.debug("counting GPUs through NVML failed", exc_info=True)
        count = -1
    if count >= 0:
        return count
    counted = in_throwaway_child(lambda: int(torch.cuda.device_count()))
    return max(0, counted or 0)


_CUDA_VERSION_LINE = re.compile(r"^cuda\s*(?::[^=]*)?=\s*(.+?)\s*$", re.MULTILINE)


def installed_torch_names_cuda(spec_of: Callable[[str], Any] = importlib.util.find_spec) -> bool:
    """Whether the installed torch may be a CUDA build, read from its ``version.py`` without
    importing torch (a second and a thousand modules a launch of a CPU build never needs): its
    ``cuda = None`` line says a CPU (or ROCm) build, for which ``cuda_build`` is False anyway.
    False when torch is not installed; True when the file says a version or cannot be read
    (then torch is imported and asked, as before). ``spec_of`` lets tests describe an install."""
    try:
        spec = spec_of("torch")
    except (ImportError, ValueError):
        return False
    if spec is None:
        return False
    try:
        folder = list(spec.submodule_search_locations or [])[0]
        with open(os.path.join(folder, "version.py"), encoding="utf-8") as f:
            found = _CUDA_VERSION_LINE.search(f.read())
    except (OSError, IndexError, UnicodeDecodeError):
        log.debug("cannot read torch's version.py; asking torch itself", exc_info=True)
        return True
    return found is None or found.group(1) != "None"


def prefer_nvml_availability_check() -> None:
    """Set PYTORCH_NVML_BASED_CUDA_CHECK=1 in this notebook, unless it is set already.

    torch reads it at every ``torch.cuda.is_available()``: with it, the call counts devices
    through NVML and leaves fork usable (torch falls back to the runtime only when NVML
    fails), at the cost of "a weaker CUDA availability assessment" (NVML sees a GPU the
    runtime might not be able to use; a later .cuda() then says so itself). Lightning sets
    it when imported. We do not: importing notebook_launch changes nothing. It is set on a
    fork launch with a CUDA build of torch, after the guards passed (the notebook is clean),
    so that an ``is_available()`` in a later cell does not spoil the next launch; a value
    the user chose (even "0") is left alone. It reaches the ranks too, where it is harmless
    (they use their device)."""
    torch = sys.modules.get("torch")
    if torch is None or not cuda_build(torch) or NVML_CHECK_VARIABLE in os.environ:
        return
    os.environ[NVML_CHECK_VARIABLE] = "1"


def in_throwaway_child(question: Callable[[], int]) -> int | None:
    """``question()`` answered in a child forked for that alone (its answer: a small
    integer), or None when the child could not answer. The child runs no OpenMP region and
    no CUDA context is inherited: forking from the caller's thread is safe here."""
    read_end, write_end = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(read_end)
        os.close(write_end)
        log.debug("could not fork a throwaway child", exc_info=True)
        return None
    if pid == 0:  # the child: answer, and never return into the caller's code
        code = 1
        try:
            os.close(read_end)
            os.write(write_end, str(int(question())).encode())
            code = 0
        except BaseException:  # noqa: S110  # why: the parent reads no answer: None
            pass
        finally:
            os._exit(code)
    os.close(write_end)
    chunks = []
    try:
        while True:
            chunk = os.read(read_end, 64)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(read_end)
        _reap(pid)
    try:
        return int(b"".join(chunks))
    except ValueError:
        log.debug("the throwaway child gave no answer")
        return None


def _reap(pid: int) -> None:
    while True:
        try:
            os.waitpid(pid, 0)
            return
        except ChildProcessError:   # reaped by someone else (a SIGCHLD handler)
            return
        except InterruptedError:
            continue
