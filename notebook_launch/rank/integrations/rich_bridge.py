"""Inside a rank, rich is a terminal-less program, and ``rich.progress`` bars are panel bars.

A rank forked from a Jupyter kernel still holds the kernel's IPython shell, so rich
(``rich.console._is_jupyter``) believes it runs in Jupyter: every ``Live`` (a ``Progress``,
``track``, Lightning's default RichProgressBar, ``console.status``) draws into an
ipywidgets ``Output`` widget whose comm messages ipykernel refuses to send from a fork.
Nothing shows, not even in the log. Here:

- ``Console.is_jupyter`` is False for every console of the rank, those made before the
  launch (``rich.get_console()``, which Lightning reuses) included, and so is
  ``is_terminal`` unless the console was made with ``force_terminal=True``: the rank's
  stdout is a pipe, though ipykernel sets ``FORCE_COLOR=1`` in the environment the rank
  inherits (a "terminal" Live would redraw with cursor codes into the cell and the log).
  Rich then writes plain text, which reaches the cell and the rank's log like a print (a
  non-terminal Live prints its final picture once, as in a script's log).
- ``rich.progress.Progress`` tells each visible task to a panel twin
  (``progress_bridge.Mirror``) at its own update points: ``add_task``, ``update``
  (``track``'s thread calls it ten times a second), ``advance``, ``reset``; a task made
  invisible (Lightning hides its validation and sanity bars between uses) or removed, and
  every task when the Progress stops, closes its panel bar. A ``Progress(disable=True)``
  reports nothing, as it draws nothing.
"""
from __future__ import annotations

import logging
from types import ModuleType
from typing import Any

from ..after_import import after_import
from .progress_bridge import Mirror

log = logging.getLogger("notebook_launch")
_PATCHED_ATTR = "_notebook_launch_patched"


def install(spec: Any = None) -> None:
    """Patch rich now if the rank has it imported, else when the rank imports it."""
    after_import("rich.console", _plain_console)
    after_import("rich.progress", _bridge_progress)


def _plain_console(console_module: ModuleType) -> None:
    """Every console of this process, old and new, is a plain (non-Jupyter, non-terminal)
    console. A data descriptor on the class wins over the attribute ``Console.__init__``
    sets on instances."""
    console_module._is_jupyter = lambda: False  # type: ignore[attr-defined]
    console = console_module.Console
    console.is_jupyter = property(lambda self: False, lambda self, value: None)
    console.is_terminal = property(lambda self: bool(self._force_terminal))


def _bridge_progress(progress_module: ModuleType) -> None:
    cls = progress_module.Progress
    if getattr(cls, _PATCHED_ATTR, False):
        return
    original = {name: cls.__dict__[name] for name in ("add_task", "update", "advance", "reset",
                                                       "remove_task", "stop")}

    def add_task(self: Any, *args: Any, **kwargs: Any) -> Any:
        task_id = original["add_task"](self, *args, **kwargs)
        _mirror(self, task_id)
        return task_id

    def update(self: Any, task_id: Any, *args: Any, **kwargs: Any) -> None:
        original["update"](self, task_id, *args, **kwargs)
        _mirror(self, task_id)

    def advance(self: Any, task_id: Any, advance: float = 1) -> None:
        original["advance"](self, task_id, advance)
        _mirror(self, task_id)

    def reset(self: Any, task_id: Any, *args: Any, **kwargs: Any) -> None:
        original["reset"](self, task_id, *args, **kwargs)
        mirror = _mirrors(self).get(task_id)
        if mirror is not None:
            mirror.reset(_task(self, task_id).total)
        _mirror(self, task_id)

    def remove_task(self: Any, task_id: Any) -> None:
        _close(self, task_id)
        original["remove_task"](self, task_id)

    def stop(self: Any) -> None:
        for task_id in list(_mirrors(self)):
            _mirror(self, task_id)   # its last count first
            _close(self, task_id)
        original["stop"](self)

    for name, method in (("add_task", add_task), ("update", update), ("advance", advance),
                         ("reset", reset), ("remove_task", remove_task), ("stop", stop)):
        method.__doc__ = original[name].__doc__
        setattr(cls, name, method)
    setattr(cls, _PATCHED_ATTR, True)


def _mirrors(progress: Any) -> dict[Any, Mirror]:
    mirrors = progress.__dict__.get("_notebook_launch_mirrors")
    if mirrors is None:
        mirrors = progress.__dict__["_notebook_launch_mirrors"] = {}
    return mirrors


def _task(progress: Any, task_id: Any) -> Any:
    return progress._tasks.get(task_id)


def _mirror(progress: Any, task_id: Any) -> None:
    """Bring the task's panel bar up to date: open it when the task shows, close it when it hides."""
    if getattr(progress, "disable", False):
        return
    task = _task(progress, task_id)
    mirrors = _mirrors(progress)
    mirror = mirrors.get(task_id)
    if task is None or not task.visible:
        if mirror is not None:
            _close(progress, task_id)
        return
    description = str(task.description)
    if mirror is None or mirror.closed:
        mirrors[task_id] = Mirror(description, task.total, initial=task.completed)
    else:
        mirror.sync(description, task.completed, task.total)


def _close(progress: Any, task_id: Any) -> None:
    mirror = _mirrors(progress).pop(task_id, None)
    if mirror is not None:
        mirror.close()
