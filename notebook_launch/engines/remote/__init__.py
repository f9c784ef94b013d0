"""What every engine whose ranks connect back from other machines shares (Ray's, SLURM's): the launcher's
shared part (``launcher.ConnectBackLauncher``: the payload, no channels ahead, the accept tail), the rank's
handle (``handle.RemoteRank``), one typed ``assignment.RankAssignment``, the serving loop of a persistent
rank (``serve``, rank side) and the persistent transport (``persistent.RemoteTransport``).

Owns: both halves of connecting back. May import: ``engines.base``, channels, wire, the rank side,
``persistent``'s transport interface, diagnosis's remote asker; never an engine.
"""
