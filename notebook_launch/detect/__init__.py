"""Where we run and which devices exist, found without initializing CUDA or XLA.

``hosted`` names the notebook service, ``xla`` finds TPUs (and PJRT settings),
``platform`` puts both together with CUDA and the frontend (and says whether the warm start process can
run here: ``start_process_possible``). The launch decision made
from these facts is ``notebook_launch.planning.target``.

Owns: the facts of the machine (hosted notebooks, TPUs, the platform). May import: errors, wire, notebook.
"""
