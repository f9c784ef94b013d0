"""Process hygiene: nothing a rank started outlives the run (``leftovers``), not even when the notebook itself
dies (``orphan_keeper``).

Owns: the ranks' process groups and strays. May import: wire, errors.
"""
