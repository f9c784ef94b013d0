"""What installed notebook_launch's hooks in this process, first (``hooks.install``): "%load_ext",
"the first launch", "notebook_launch.install_hooks()"; None while they are not installed.

A fact of the notebook's process, kept apart from ``hooks`` (which installs them, the fork
launcher's between-cells imports among them): the guards (``preflight``) quote it when they
cannot name the line that initialized CUDA, and read it here without importing an engine.
"""
from __future__ import annotations

_installed_by: str | None = None


def note_installed(by: str) -> bool:
    """Record ``by`` if nothing installed the hooks yet; whether this is the first install."""
    global _installed_by
    if _installed_by is not None:
        return False
    _installed_by = by
    return True


def installed_by() -> str | None:
    """What installed the hooks (None: not installed in this process)."""
    return _installed_by
