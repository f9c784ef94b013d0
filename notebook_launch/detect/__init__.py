"""Where we run and which devices exist, found without initializing CUDA or XLA.

``hosted`` names the notebook service, ``xla`` finds TPUs (and PJRT settings),
``platform`` puts both together with CUDA and the frontend; ``target`` is the
one decision the launcher and ``notebook-launch env`` share.
"""
