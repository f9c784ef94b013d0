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

Measured and not chosen (README, Benchmarks): importing it on a background thread
when ``notebook_launch`` is imported. A fork while another thread holds an import
lock leaves the child deadlocked on that module, so every fork would have to wait
for the import to finish: the first launch would pay it all the same.
"""
from __future__ import annotations

import functools
import logging
import sys
import types
from collections.abc import Callable
from typing import Any

log = logging.getLogger("notebook_launch")

# Names whose presence in the launched code means it will likely construct DDP,
# step an optimizer or compile: the paths that import torch._dynamo.
TRAINING_NAMES = frozenset({
    "DistributedDataParallel", "DDP", "backward", "optim", "Optimizer", "zero_grad", "compile",
    "Accelerator", "prepare", "Trainer", "Fabric", "fit", "FullyShardedDataParallel", "FSDP",
    "fully_shard", "_dynamo",
})
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
    seen: set[int] = set()
    frontier = [(f, 0) for f in _functions_of(function)]
    home = {f.__module__ for f, _ in frontier}
    while frontier and len(seen) < MAX_CODE_OBJECTS:
        func, depth = frontier.pop()
        if id(func.__code__) in seen:
            continue
        for code in _code_objects(func.__code__):
            seen.add(id(code))
            if TRAINING_NAMES.intersection(code.co_names):
                return True
            if depth < MAX_DEPTH:
                for name in code.co_names:
                    value = func.__globals__.get(name)
                    if callable(value) and getattr(value, "__module__", None) in home:
                        frontier += [(f, depth + 1) for f in _functions_of(value)]
    return False


def warm_for(function: Callable[..., Any]) -> None:
    """Import in the parent what the ranks of this launch would import after the fork."""
    from ..rank import process_groups, progress, tqdm_bridge  # noqa: F401  (ours: ms per rank)
    if "torch" not in sys.modules or "torch._dynamo" in sys.modules:
        return
    try:
        if not looks_like_training(function):
            return
    except Exception:   # an odd callable: import, as before
        log.debug("could not read the launched function's code", exc_info=True)
    try:
        import torch._dynamo
        import torch.nn.parallel  # noqa: F401
    except Exception:
        log.debug("warming torch._dynamo failed; ranks import it themselves", exc_info=True)
