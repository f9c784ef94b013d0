"""Displays render the run state; they never change it (a Stop button only
sets ``state.stop_requested``). ``choose_display`` picks one for where we run."""
from __future__ import annotations

import sys

from .base import Display
from .text import TextDisplay

UI_CHOICES = ("auto", "widget", "html", "rich", "text", "none")


def choose_display(ui: str = "auto", *, line_prefix=None) -> Display:
    if ui == "none":
        return Display(line_prefix=line_prefix)
    return TextDisplay(line_prefix=line_prefix, stream_is_notebook=_in_notebook())


def _in_notebook() -> bool:
    from ..environment import in_ipython_kernel
    return in_ipython_kernel()


__all__ = ["Display", "TextDisplay", "choose_display", "UI_CHOICES"]
