"""The parent side of a run: watch the ranks' fds (``watch``), decide what each end
means (``outcome``), and drive both, stopping everything on the first failure (``supervisor``).

Owns: a run's supervision, from the ranks' fds to its outcome. May import: channels, wire, diagnose, record,
process, notebook, errors; never a launcher or an engine.
"""
