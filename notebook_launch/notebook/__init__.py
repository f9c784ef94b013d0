"""What the notebook's own process holds: whether CUDA was initialized in it, who made an Accelerate state,
its own standard streams, its kernel's shell channel (``kernel_poll``: the panel's Stop button is heard while
the cell runs), what installed notebook_launch's hooks in it (``hooks_record``), and its SIGINT while we
hold it (``interrupt_gate``).

Owns: facts about the notebook's process. May import: errors, detect.
"""
