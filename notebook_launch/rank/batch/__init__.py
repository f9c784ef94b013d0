"""``find_executable_batch_size`` (``batch_size``): Accelerate's decorator, agreed on by every rank of the group:
who is in one call (``batch_size_call``) and how a failed attempt lets go of its group (``batch_size_group``).

Owns: the in-rank batch-size search. May import: ``rank.group``, errors; never the notebook side or an engine.
"""
