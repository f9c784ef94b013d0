"""Inside a rank, tqdm bars (tqdm.std, tqdm.auto, tqdm.notebook, ...) become panel bars.

Without this, each rank's tqdm writes carriage-return redraws into the shared
cell (garbled, interleaved), and tqdm.notebook would try to create widgets in
a child process that has no kernel connection. The bridge patches the tqdm
classes in place (the notebook may already hold ``from tqdm.auto import tqdm``
from before the launch, so swapping module attributes would not be enough):
every instance counts with tqdm's own ``__iter__``/``update`` and throttling,
writes nowhere (except into a file of the user's own, ``tqdm(file=f)``, which
gets what plain tqdm writes), and its ``display`` hands n/total/desc to its panel twin
(``progress_bridge.Mirror``, the design every library adapter shares) and its postfix
numbers to the row's metrics. Installed by ``progress_bridge.install``; only ever runs in rank processes.
"""
from __future__ import annotations

import importlib.util
import logging
import sys
from typing import Any

from ..inherited_streams import writes_to_rank_output
from ..reports.progress import log as log_metrics
from ..after_import import after_import
from .progress_bridge import Mirror

_PATCHED_ATTR = "_notebook_launch_patched"
log = logging.getLogger("notebook_launch")


class _Discard:
    """A file that drops tqdm's text output."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        """Nothing is buffered."""

    def isatty(self) -> bool:
        return False


_active = False   # True in a rank: the first-bar hook made in the notebook acts there only
_FIRST_BAR = "_notebook_launch_first_bar"
_hooked: Any = None   # the tqdm class the notebook hooked before the forks (``hook_before_forks``)


def hook_before_forks() -> None:
    """In the notebook, before a launch's forks: put the first-bar hook (``_hook_first_bar``) on
    an imported tqdm once, inert there (a bar the notebook makes is tqdm's own, through one more
    frame), so a forked rank only turns it on. Set in each rank, ``tqdm.__new__`` updated the
    slots of tqdm and of every subclass, about 0.3 ms of every rank's CPU, most of it the
    notebook's pages that wrote to, copied after the fork (issue 45). Nothing is imported for it."""
    global _hooked
    _hooked = None
    base = getattr(sys.modules.get("tqdm.std"), "tqdm", None)
    new = getattr(base, "__dict__", {}).get("__new__")
    if not isinstance(new, staticmethod) or getattr(base, _PATCHED_ATTR, False):
        return   # not imported, or not a tqdm this bridge knows: the rank decides, as before
    if not getattr(new.__func__, _FIRST_BAR, False):
        _hook_first_bar(sys.modules["tqdm.std"], new)
    _hooked = base


def install(spec: Any = None) -> bool:
    """Patch tqdm in this rank now if it is imported, else when the rank imports it (a rank
    that never uses tqdm does not pay for importing it); False when tqdm is not installed."""
    global _active
    _active = True
    if _hooked is not None and not _bars_alive(_hooked):
        return True   # the notebook's hook, on now (the checks below cost a forked rank 0.15 ms)
    if "tqdm" not in sys.modules and importlib.util.find_spec("tqdm") is None:
        return False
    after_import("tqdm.std", _patch_on_first_bar)
    return True


def _bars_alive(base: Any) -> bool:
    """Whether a bar of ``base`` may be alive (its weak set's own set: ``len`` of the WeakSet runs
    Python; a dead bar not yet dropped only patches tqdm sooner)."""
    instances = getattr(base, "_instances", None)
    return bool(getattr(instances, "data", instances))


def _patch_on_first_bar(std: Any) -> None:
    """Patch tqdm when the rank makes its first bar, not at its start: a notebook that imported
    tqdm (torch does) had every rank patch its classes, about 0.8 ms of each rank's CPU, the
    pages touched copied after the fork, for ranks that draw no bar. Every bar is made through
    ``tqdm.__new__`` (subclasses inherit it) and ``__init__`` is looked up on the class after
    ``__new__`` returns, so patching there gives the first bar the patched class, as before.
    Bars that already exist (made in the notebook before the launch and used in the rank) have
    no ``__new__`` left to run: with any alive, tqdm is patched now. The hook the notebook put
    on before the fork (``hook_before_forks``) is on already."""
    base = std.tqdm
    new = base.__dict__.get("__new__")
    if getattr(base, _PATCHED_ATTR, False) or not isinstance(new, staticmethod) or len(getattr(base, "_instances", ())):
        _patch_std(std)
    elif not getattr(new.__func__, _FIRST_BAR, False):
        _hook_first_bar(std, new)


def _hook_first_bar(std: Any, new: staticmethod) -> None:
    """Make ``tqdm.__new__`` (``new``, tqdm's own) patch tqdm at the first bar made in a rank
    (``_active``), putting tqdm's own back first; elsewhere it only calls tqdm's own."""
    base = std.tqdm

    def __new__(cls: Any, *args: Any, **kwargs: Any) -> Any:
        if _active and base.__dict__.get("__new__") is first:   # once: put tqdm's own back, then patch
            base.__new__ = new
            _patch_std(std)
        return new.__func__(cls, *args, **kwargs)

    setattr(__new__, _FIRST_BAR, True)
    first = staticmethod(__new__)
    base.__new__ = first


def _patch_std(std: Any) -> None:
    base = std.tqdm
    if getattr(base, _PATCHED_ATTR, False):
        _patch_tree(base)
        return
    originals = {name: base.__dict__[name] for name in
                 ("__init__", "display", "close", "__iter__", "update", "clear", "reset",
                  "status_printer", "set_postfix", "set_description")}
    _install_methods(base, originals)
    base.monitor_interval = 0   # no tqdm monitor thread per rank; our flusher handles slow loops
    _patch_tree(base)


def _bound(original: Any, self: Any) -> Any:
    """tqdm's __init__ may be a functools.partialmethod (its env-var config): bind like Python does."""
    return original.__get__(self, type(self))


def _std(self: Any, name: str) -> Any:
    """tqdm's own method ``name`` (kept on the patched base by ``_install_methods``), bound to ``self``."""
    return _bound(self._notebook_launch_std[name], self)


def _init(self: Any, *args: Any, **kwargs: Any) -> None:
    for key in ("display", "gui", "console", "options", "progress", "nrows"):
        kwargs.pop(key, None)   # drawing options of tqdm.notebook / tqdm.rich / tqdm.gui
    if "disable" in kwargs and kwargs["disable"] is None:
        kwargs["disable"] = False   # "off when not a terminal": the panel is the terminal here
    # The user's own file gets what plain tqdm writes; the rank's stdout/stderr (tqdm's
    # default) get nothing, the panel shows the bar. ``file`` is tqdm's 5th parameter.
    file = args[4] if len(args) > 4 else kwargs.get("file")
    self._writes_user_file = not writes_to_rank_output(file)
    if not self._writes_user_file:
        args = args[:4]
        kwargs["file"] = _Discard()
    kwargs.setdefault("mininterval", 0.1)
    self._panel = None
    _std(self, "__init__")(*args, **kwargs)
    if not self.disable:
        self._panel = Mirror(self.desc or "", self.total, unit=self.unit, initial=self.n)


def _panel_sync(self: Any) -> None:
    mirror = getattr(self, "_panel", None)
    if mirror is not None:
        mirror.sync(self.desc or "", self.n, self.total)


def _display(self: Any, msg: Any = None, pos: Any = None) -> bool:
    self._panel_sync()
    if getattr(self, "_writes_user_file", False):
        return _std(self, "display")(msg, pos)
    return True


def _close(self: Any) -> Any:
    if getattr(self, "_panel", None) is not None and not self.disable:
        self._panel_sync()
        self._panel.close()
    return _std(self, "close")()


def _set_postfix(self: Any, ordered_dict: Any = None, refresh: bool = True, **kwargs: Any) -> None:
    _std(self, "set_postfix")(ordered_dict, refresh=refresh, **kwargs)
    metrics = dict(ordered_dict or {}, **kwargs)
    numeric = {k: v for k, v in metrics.items() if not isinstance(v, str)}
    if numeric and getattr(self, "_panel", None) is not None:
        log_metrics(**numeric)


def _reset(self: Any, total: Any = None) -> None:
    _std(self, "reset")(total=total)
    if getattr(self, "_panel", None) is not None:
        self._panel.reset(total=self.total)


# What the patched base's methods become: each reaches tqdm's own through ``_std``.
_METHODS = {"__init__": _init, "display": _display, "close": _close, "set_postfix": _set_postfix,
            "reset": _reset, "_panel_sync": _panel_sync}


def _install_methods(base: Any, originals: dict[str, Any]) -> None:
    for name, method in _METHODS.items():
        setattr(base, name, method)
    base._notebook_launch_std = originals
    setattr(base, _PATCHED_ATTR, True)

    def __init_subclass__(cls: Any, **kw: Any) -> None:
        super(base, cls).__init_subclass__(**kw)
        _patch_class(cls, base)

    base.__init_subclass__ = classmethod(__init_subclass__)


# Subclasses (tqdm.notebook, tqdm.rich, tqdm.gui, tqdm.asyncio ...) override these to draw
# their own way; in a rank they must behave like the patched base.
_OVERRIDES = ("__init__", "display", "close", "__iter__", "update", "clear", "reset",
              "status_printer", "set_postfix", "set_description", "refresh", "moveto")


def _patch_tree(base: Any) -> None:
    stack = list(base.__subclasses__())
    while stack:
        cls = stack.pop()
        _patch_class(cls, base)
        stack.extend(cls.__subclasses__())


def _patch_class(cls: Any, base: Any) -> None:
    """tqdm's own variants fall back to the patched base; other libraries' subclasses
    (e.g. one that disables bars by an environment variable) keep their logic and
    reach the patched base through super()."""
    if cls.__module__.split(".")[0] == "tqdm":
        for name in _OVERRIDES:
            if name in cls.__dict__:
                try:
                    delattr(cls, name)
                except (AttributeError, TypeError):
                    log.debug("tqdm subclass %s keeps its own %s", cls.__qualname__, name)
    cls.monitor_interval = 0
