"""Hang diagnosis, in one place (issue 31): every path that asks where ranks are (a launch's
supervisor, elastic's attempts, ``Ranks.stacks()``) calls ``ranks.where_ranks``, which asks each
process the way it answers (``RankProcess.where``: XLA's launcher through its engine's replica
records, ``engines.xla.replica_whereabouts``; a Ray actor over its connections; every other rank by
pid). ``stacks`` and ``where_thread`` ask a rank's
where-thread (a signal only where the interpreter lock is held), reading what it keeps
(``memfds``, ``faulthandler_dump``); ``native_stacks`` adds py-spy's native frames and a rank's
stuck forked children; ``proc_tasks`` is the one walk over a process's threads in /proc;
``hang_verdict`` is the verdict and the detail, ``stall`` stall detection. Nothing here imports
its callers: what it finds goes back to them, which log and draw it.

Owns: where every rank is and the verdict of a hang or a stall. May import: channels, wire, errors, the rank
side's formats; never its callers (the supervisor, persistent ranks, engines, displays, the run state).
"""
