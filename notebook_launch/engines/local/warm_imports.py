"""What the notebook imports before forking, so forked ranks share it instead of each paying it.

``torch._dynamo`` is the expensive one: DDP's constructor and forward, and every
optimizer's ``step``/``zero_grad``, import it lazily (about 800 modules, 1-4 s in
each rank, measured in benchmarks/ items 2 and 6). Imported once in the parent, forked ranks get it for
free. But a launch that never trains (a quick check, a data job) would pay it
(1-2 s) for nothing, on the first launch in a fresh kernel, which is what users
see first. So the parent imports it only when the launched code looks like
training: a name among ``TRAINING_NAMES`` in the function's code or in the
functions it calls by global name (followed a few levels into the notebook's own
helpers). Both ways of being wrong are safe: a miss means the ranks import it
themselves (as they do under Accelerate), a false hit means today's cost. Once
imported it stays imported, so later launches never pay it again.

In a Jupyter kernel the import can also happen while nobody waits for it: between
cells (``warm_between_cells``). When a cell ends with torch imported and the notebook
now defines a function or class that looks like training (the same test), a background
thread imports torch._dynamo while the user reads and types; the next cell waits for
it before it runs (so no notebook code, and no fork, ever runs beside an import: a
fork while another thread holds an import lock leaves the child deadlocked on that
module), and so does any fork in the meantime (``os.register_at_fork``). A launch in
a later cell then finds it imported. Not at ``import notebook_launch`` in a script:
there the launch usually follows at once and would wait for it all the same.

torch itself is treated alike: a notebook that has not imported it gets it imported before
the fork only when the launched code names ``torch`` (``_import_torch_for``), so the ranks
share one import; a launch of code that never names it imports nothing heavy.
"""
from __future__ import annotations

import functools
import importlib
import logging
import os
import sys
import threading
import types
import weakref
from collections.abc import Callable
from typing import Any

from ...notebook import cuda_tracking
from ...errors.best_effort import best_effort

log = logging.getLogger("notebook_launch")

# Names whose presence in the launched code means it will likely construct DDP,
# step an optimizer or compile: the paths that import torch._dynamo.
TRAINING_NAMES = frozenset({
    "DistributedDataParallel", "DDP", "backward", "optim", "Optimizer", "zero_grad", "compile",
    "Accelerator", "prepare", "Trainer", "Fabric", "fit", "FullyShardedDataParallel", "FSDP",
    "fully_shard", "_dynamo",
})
TORCH_NAMES = frozenset({"torch"})   # code that names it imports torch in every rank
MAX_DEPTH = 3        # how far to follow helper functions called by global name
MAX_CODE_OBJECTS = 500


def _functions_of(target: Any) -> list[types.FunctionType]:
    """The plain functions behind a callable: partials, bound methods, callable objects."""
    if isinstance(target, functools.partial):
        return _functions_of(target.func)
    if isinstance(target, types.MethodType):
        return _functions_of(target.__func__)
    if isinstance(target, types.FunctionType):
        return [target]
    if isinstance(target, type):
        return [v for v in vars(target).values() if isinstance(v, types.FunctionType)]
    call = vars(type(target)).get("__call__")   # an object of a class that defines __call__
    return [call] if isinstance(call, types.FunctionType) else []


def _code_objects(code: types.CodeType) -> list[types.CodeType]:
    """``code`` and the code of every function, lambda and class body defined inside it."""
    found, stack = [], [code]
    while stack:
        current = stack.pop()
        found.append(current)
        stack.extend(c for c in current.co_consts if isinstance(c, types.CodeType))
    return found


def looks_like_training(function: Callable[..., Any]) -> bool:
    """True when ``function`` (or a helper or class of its own module that it names) names a
    training API. Library code is not followed: it names everything."""
    return names_any(function, TRAINING_NAMES)


def names_any(function: Callable[..., Any], names: frozenset[str]) -> bool:
    """True when ``function`` (or a helper or class of its own module that it names) names one
    of ``names`` (a global, an attribute or an import)."""
    seen: set[int] = set()
    frontier = [(f, 0) for f in _functions_of(function)]
    home = {f.__module__ for f, _ in frontier}
    while frontier and len(seen) < MAX_CODE_OBJECTS:
        func, depth = frontier.pop()
        if id(func.__code__) in seen:
            continue
        for code in _code_objects(func.__code__):
            seen.add(id(code))
            if names.intersection(code.co_names):
                return True
            if depth < MAX_DEPTH:
                for name in code.co_names:
                    value = func.__globals__.get(name)
                    if callable(value) and getattr(value, "__module__", None) in home:
                        frontier += [(f, depth + 1) for f in _functions_of(value)]
    return False


def warm_for(function: Callable[..., Any], say: Callable[[str], None] = lambda text: None) -> None:
    """Import in the parent what the ranks of this launch would import after the fork; ``say``
    is told what takes the time (the panel's rows say it while they start: a first run sat at
    "starting" for seconds with nothing said)."""
    if _background is not None and _background.is_alive():
        say("importing torch._dynamo for training (once, for every rank)")
    wait_for_background_import()
    from ...rank.installs import warm
    warm()   # ours: ms per rank
    if "torch" not in sys.modules and not _import_torch_for(function, say):
        return
    if "torch._dynamo" in sys.modules:
        return
    # an odd callable: import, as before
    with best_effort("could not read the launched function's code"):
        if not looks_like_training(function):
            return
    say("importing torch._dynamo for training (once, for every rank)")
    import_training_modules()


def _import_torch_for(function: Callable[..., Any], say: Callable[[str], None] = lambda text: None) -> bool:
    """Import torch here when the launched code names it, so the forked ranks share one import
    (about a second and a thousand modules each otherwise); True when it did. Code that never
    names torch does not pay for it: ``import notebook_launch`` and a launch import nothing
    heavy of their own. The CUDA witnesses (``cuda_tracking``) then wrap the torch just imported."""
    try:
        if not names_any(function, TORCH_NAMES):
            return False
    except Exception:   # why: an odd callable: its ranks import what they need
        log.debug("could not read the launched function's code", exc_info=True)
        return False
    say("importing torch (once, for every rank)")
    try:
        import torch  # noqa: F401
    except Exception:   # why: warming is a speed-up: a torch that fails here fails in the rank, reported there
        log.debug("torch is named by the launched code but does not import here", exc_info=True)
        return False
    cuda_tracking.install()
    return True


# What a training rank imports lazily (DDP's constructor, an optimizer's step): imported once before
# the ranks start, here before a fork, in the warm start process before it forks (engines.local.spawn).
TRAINING_MODULES = ("torch._dynamo", "torch.nn.parallel")


def import_training_modules() -> None:
    """torch._dynamo and DDP's module: what a training rank would import after the fork."""
    with best_effort("warming torch._dynamo failed; ranks import it themselves"):
        for name in TRAINING_MODULES:
            importlib.import_module(name)


# --- between cells, in a Jupyter kernel -------------------------------------------------

OPT_OUT = "NOTEBOOK_LAUNCH_PREIMPORT"    # =0: never import torch._dynamo between cells
_background: threading.Thread | None = None
_hooked = False
_shell: Any = None
_read: "weakref.WeakSet[Any]" = weakref.WeakSet()   # notebook functions and classes already read


def warm_between_cells(shell: Any) -> bool:
    """Hook ``shell`` (a Jupyter kernel's) so torch._dynamo is imported after a cell, while
    the kernel waits for the user; False when not hooked (opted out, or already hooked)."""
    global _hooked, _shell
    if _hooked or os.environ.get(OPT_OUT, "").strip().lower() in ("0", "false", "no", "off"):
        return False
    _shell = shell
    shell.events.register("post_run_cell", _after_cell)
    shell.events.register("pre_run_cell", _before_cell)
    os.register_at_fork(before=wait_for_background_import)
    _hooked = True
    return True


def _after_cell(result: Any = None) -> None:
    """The kernel is about to wait for the user: import now if a launch will want it."""
    global _background
    if _background is not None or "torch" not in sys.modules or "torch._dynamo" in sys.modules:
        return
    if "NOTEBOOK_LAUNCH_RANK" in os.environ:   # a rank (a forked kernel): nothing to prepare
        return
    if not notebook_defines_training():   # a quick launch must not wait for an import it never needs
        return
    _background = threading.Thread(target=import_training_modules, name="notebook_launch-preimport",
                                   daemon=True)
    _background.start()


def notebook_defines_training() -> bool:
    """Whether a function or class defined in the notebook (read once each) looks like training."""
    namespace = getattr(_shell, "user_ns", None) or {}
    for value in list(namespace.values()):
        if not isinstance(value, (types.FunctionType, type)) or getattr(value, "__module__", None) != "__main__":
            continue
        try:
            if value in _read:
                continue
            _read.add(value)
        except TypeError:   # not weak-referenceable: read it every time
            pass
        with best_effort("could not read %r", value):
            if looks_like_training(value):
                return True
    return False


def _before_cell(info: Any = None) -> None:
    wait_for_background_import()


def wait_for_background_import() -> None:
    """Block until the between-cells import is done (at most once per kernel, about a second):
    the next cell, a fork and a launch never run beside it."""
    thread = _background
    if thread is None or thread is threading.current_thread():
        return
    while thread.is_alive():
        try:
            thread.join()
        except KeyboardInterrupt:   # an interrupt must not let a cell run beside the import
            log.debug("interrupt while waiting for the torch._dynamo import; still waiting")
