"""``after_import(name, callback)``: patch a library in this rank now if it is imported, else right
after the rank imports it, so a rank that never uses the library pays nothing for its patch.

Every in-rank patch uses it: the progress bars' adapters (tqdm, rich, Transformers), Lightning's
strategies, and the process group's wrappers (``joining``, ``peers_joined``). It lived in
``progress_bridge``; it is the rank's own tool, not a bridge's, so what patches torch.distributed
does not import the progress bridges for it.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from types import ModuleType
from typing import Any, Callable, Sequence

from ..errors.best_effort import best_effort


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs a callback right after one module is first imported in this process."""

    def __init__(self, name: str, callback: Callable[[ModuleType], None]) -> None:
        self.name, self.callback, self.busy = name, callback, False

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        if fullname != self.name or self.busy:
            return None
        self.busy = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self.busy = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader, callback = spec.loader, self.callback

        class Loader(importlib.abc.Loader):
            def create_module(self, spec: Any) -> Any:
                return loader.create_module(spec)

            def exec_module(self, module: ModuleType) -> None:
                loader.exec_module(module)
                _remove(self_finder)
                # the library still works, only unbridged
                with best_effort("patching %s in the rank failed", fullname):
                    callback(module)

        self_finder = self
        spec.loader = Loader()
        return spec


def _remove(finder: Any) -> None:
    try:
        sys.meta_path.remove(finder)
    except ValueError:
        pass   # already gone


def after_import(name: str, callback: Callable[[ModuleType], None]) -> None:
    """``callback(module)`` now if ``name`` is imported, else right after the rank imports it."""
    module = sys.modules.get(name)
    if module is not None:
        callback(module)
    else:
        sys.meta_path.insert(0, _AfterImport(name, callback))
