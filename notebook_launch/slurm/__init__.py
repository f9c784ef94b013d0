"""The SLURM engine: ``notebook_launcher(fn, num_processes=N, cluster=SlurmCluster(...))`` runs the
ranks on a SLURM allocation, inside the same run scaffold, launcher interface, supervisor, panel,
outcome and results as a local launch.

``cluster`` (the checked description, light: imported with the package), ``run`` (the launch),
``launcher`` (``SlurmLauncher``: the allocation, one ``srun`` step per rank, each rank's streams
connected back over TCP as Ray ranks' are: ``channels.sockets``), ``ranks`` (a rank's srun step as the
supervisor's process handle, and the listener), ``scheduler`` (the SLURM
commands and what the scheduler says of a job), ``watchdog`` (the process that cancels the job if
the notebook dies) and ``task`` (the rank's side, run by srun on a node; it imports only the rank
side). Nothing here is imported until a launch names ``SlurmCluster``.
"""
