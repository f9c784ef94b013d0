"""``notebook_launch.slurm.node_agent`` moved to ``notebook_launch.engines.slurm.node_agent``; this name
keeps working (``python -m`` too)."""
from __future__ import annotations

import sys

from notebook_launch.engines.slurm.node_agent import *  # noqa: F401,F403
from notebook_launch.engines.slurm.node_agent import main

if __name__ == "__main__":
    sys.exit(main())
