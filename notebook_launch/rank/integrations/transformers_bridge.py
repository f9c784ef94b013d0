"""Inside a rank, the Transformers Trainer's notebook bars are panel bars too.

In a notebook (a rank forked from one included) the Trainer draws its progress with
``transformers.utils.notebook.NotebookProgressBar``: HTML updated through a display id,
not tqdm. The display relay brings that HTML (with the loss table) to the cell for the
ranks it shows (``display_ranks``); this adapter gives every rank's row the same bar, as
the tqdm and rich adapters do (``progress_bridge.Mirror``): the training tracker, then
each evaluation's child bar while it runs.
"""
from __future__ import annotations

from types import ModuleType
from typing import Any

from ..after_import import after_import
from .progress_bridge import Mirror

_PATCHED_ATTR = "_notebook_launch_patched"
_MIRROR_ATTR = "_notebook_launch_mirror"


def install(spec: Any = None) -> None:
    after_import("transformers.utils.notebook", _bridge)


def _bridge(module: ModuleType) -> None:
    cls = module.NotebookProgressBar
    if getattr(cls, _PATCHED_ATTR, False):
        return
    original_update, original_close = cls.update, cls.close
    tracker = module.NotebookTrainingTracker
    original_remove_child = tracker.remove_child

    def update(self: Any, value: int, force_update: bool = False, comment: str | None = None) -> None:
        original_update(self, value, force_update=force_update, comment=comment)
        mirror = self.__dict__.get(_MIRROR_ATTR)
        desc = self.prefix or ("evaluation" if self.parent is not None else _training_desc(self))
        if mirror is None:
            mirror = self.__dict__[_MIRROR_ATTR] = Mirror(desc, self.total, unit="step")
        mirror.sync(desc, _shown(self), self.total)

    def close(self: Any) -> None:
        _close(self)
        original_close(self)

    def remove_child(self: Any) -> None:
        child = getattr(self, "child_bar", None)
        if child is not None:
            _close(child)
        original_remove_child(self)

    update.__doc__, close.__doc__ = original_update.__doc__, original_close.__doc__
    cls.update, cls.close, tracker.remove_child = update, close, remove_child
    setattr(cls, _PATCHED_ATTR, True)


def _shown(bar: Any) -> int:
    """The count the bar draws. Its ``value`` can pass its total: the Trainer's ``on_step_end`` passes
    ``global_step + 1``, so after the last step ``value`` is 9 of 8 until ``on_train_end`` sets 8 (the
    bar clamps what it draws, not ``value``); a send between the two showed 9/8 at the end."""
    value = bar.value or 0
    return min(value, bar.total) if bar.total else value


def _training_desc(bar: Any) -> str:
    """The training tracker has no prefix; its comment says 'Epoch 1/3'."""
    comment = bar.comment or ""
    return comment.split(",")[0] if comment.startswith("Epoch") else "training"


def _close(bar: Any) -> None:
    mirror = bar.__dict__.pop(_MIRROR_ATTR, None)
    if mirror is not None:
        mirror.close()
