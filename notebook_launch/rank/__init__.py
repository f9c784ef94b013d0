"""What runs inside a rank: bootstrap (detach, capture output, exit), the runner, and in-rank APIs.

Owns: everything that runs inside a rank. May import: wire, channels, record's formats, detect, errors; never
the notebook side (launchers, the supervisor, the run scaffold, the API) nor an engine.
"""
