"""The run around the ranks: the run scaffold (``run``: ``run_plan``, ``supervise_attempts``), one session (the
run folder, the display, the launch line, the final status), the restart rule and the signal handlers put back
exactly.

Owns: a run's life from the launch line to its results. May import: planning, engines.base (the launcher
interface), supervise, display, record, wire, errors.
"""
