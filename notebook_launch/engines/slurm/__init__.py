"""The SLURM engine: ``notebook_launcher(fn, num_processes=N, cluster=SlurmCluster(...))`` runs the
ranks on a SLURM allocation, inside the same run scaffold, launcher interface, supervisor, panel,
outcome and results as a local launch.

``cluster`` (the checked description, light: imported with the package), ``run`` (the launch),
``launcher`` (``SlurmLauncher``: the allocation, one ``srun`` step per node, each rank's streams
connected back over TCP as Ray ranks' are: ``channels.sockets``), ``agents`` (a node's step and
each rank its agent forked, as the supervisor's process handles), ``ranks`` (the listener, and a rank
that is its own srun step), ``scheduler`` (the SLURM commands and what the scheduler says of a job),
``records`` and ``feasibility`` (the partitions' and nodes' records, and whether a job can ever start),
``watchdog`` (the process that cancels the job if the notebook dies), ``node_agent`` (the node's
side, run by srun: imports torch once and forks the node's ranks) and ``task`` (the rank's side; both
import only the rank side). Nothing here is imported until a launch names ``SlurmCluster``.

Owns: running ranks on a SLURM allocation (``engine.SlurmEngine``; persistent ranks: ``persistent``).
May import: ``engines.base``, ``engines.remote``, ``engines.local``'s warm imports, the options and the plan,
the run scaffold, ``persistent``'s pool, the rank side; its rank side (``node_agent``, ``task``) only the
rank side and ``remote``.
"""
