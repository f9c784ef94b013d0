"""Ray's engine in one folder: ``notebook_launcher(..., cluster=RayCluster(...))`` and
``start_ranks(..., cluster=RayCluster(...))``.

The notebook's side: ``cluster`` (``RayCluster``, the checked description, importing nothing of Ray),
``connect`` (connecting to the cluster and what it has), ``run`` (a run's attempts inside the run scaffold),
``launch`` (``RayLauncher``, on ``remote.launcher.ConnectBackLauncher``) and ``gang`` (the placement group
and one actor per rank, each a ``remote.handle.RemoteRank``); ``engine`` (``RayEngine``, its
``engines.Engine``). The rank's side: ``actor`` (``RankActor``, what each actor runs; a persistent one
serves calls with ``remote.serve``). Persistent ranks: ``persistent`` (``RayRanks``, ``RayTransport``).
Importing this package imports nothing (not Ray, not its modules).

Owns: placing and starting ranks as Ray actors. May import: ``engines.base``, ``engines.remote``, the
options and the plan, the run scaffold, ``persistent``'s pool and transport interface, the rank side, wire
and channels; never another engine. Its rank side (``actor``) imports only the rank side and ``remote``.
"""
