"""Point a venv copied from another clone at this one: ``python3 scripts/venv_moved.py OLD_ROOT NEW_ROOT VENV``.

scripts/setup.sh hard-links a venv another clone built (``OLD_ROOT``) into this clone (``NEW_ROOT``). The
venv names the clone it was built in: its console scripts' first lines (``#!OLD_ROOT/.venv/bin/python``),
its activate scripts, and the editable install of notebook_launch (the finder's path to the package, the
install's URL). Every text file outside byte code that names ``OLD_ROOT`` followed by ``/`` or a quote is
written anew, as a new file: its hard-linked original, shared with the kept venv, is left as it was.
Byte code needs nothing: Python corrects a code object's file name to where it loaded it from.
"""
from __future__ import annotations

import os
import sys


def moved(old_root: str, new_root: str, venv: str) -> int:
    """Rewrite the files of ``venv`` that name ``old_root``; how many were rewritten."""
    pairs = [(f"{old_root}{end}".encode(), f"{new_root}{end}".encode()) for end in ("/", '"', "'", "\n")]
    count = 0
    for folder, dirs, files in os.walk(venv):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            path = os.path.join(folder, name)
            if os.path.islink(path):
                continue
            with open(path, "rb") as file:
                data = file.read(8192)
                if b"\0" in data:   # binary (libraries, wheels' data): never names the clone
                    continue
                data += file.read()
            if old_root.encode() not in data:
                continue
            for old, new in pairs:
                data = data.replace(old, new)
            mode = os.stat(path).st_mode
            fresh = f"{path}.moved"
            with open(fresh, "wb") as file:
                file.write(data)
            os.chmod(fresh, mode)
            os.replace(fresh, path)   # a new inode: the kept venv's file keeps its text
            count += 1
    return count


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__.splitlines()[0])
    print(f"venv_moved: {moved(*sys.argv[1:])} files now name {sys.argv[2]}", file=sys.stderr)
