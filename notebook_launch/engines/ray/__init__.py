"""Ray, the notebook's side: ``notebook_launcher(..., cluster=RayCluster(...))`` in one folder.

``cluster`` (``RayCluster``, the checked description, importing nothing of Ray), ``connect``
(connecting to the cluster and what it has), ``run`` (a run's attempts inside the run
scaffold), ``launch`` (``RayLauncher``, the launcher interface's Ray start) and ``gang`` (the
placement group and one actor per rank, each a ``RankProcess``). Asking a rank where it is
is hang diagnosis's, shared with SLURM (``diagnose.remote_where``). Importing this package
imports nothing (not Ray, not its modules): ``notebook_launch.RayCluster`` comes from
``ray.cluster`` alone.

Two halves of Ray live elsewhere, each for a rule of the import graph
(tests/test_import_graph.py):

- the rank's half, what runs inside each actor, is ``rank.ray_actor``, ``rank.ray_serve`` and
  ``rank.remote_where`` (shared with SLURM's tasks): ``rank/`` holds everything that runs in a
  rank, and the rule that it imports nothing of the notebook side is checked package by
  package, so a module here (a package that imports the run scaffold and the supervisor's
  outcome) could not be held to it;
- persistent ranks on Ray are ``persistent.ray_ranks``: ``RayTransport``, the pool's transport
  for Ray actors (``persistent.transport.RankTransport``), and ``RayRanks``, the pool with each
  rank's node; ``start_ranks`` and ``%ranks`` (``persistent``) make them, so here they would make
  ``persistent`` and ``ray`` import each other.

Another engine (SLURM) sits beside this package the same way: ``notebook_launch/<engine>/``
with its description, connection, run and launcher, its rank half in ``rank/``.
"""
