"""The JupyterLab server's kernel manager for the browser tests: jupyter_server's, with each
kernel's ports from the server process's own block below the ephemeral range
(``helpers.kernel_ports``: why). Named in the server's command line
(``--AsyncMappingKernelManager.kernel_manager_class``), imported in the server's process."""
from __future__ import annotations

from jupyter_server.services.kernels.kernelmanager import ServerKernelManager

from helpers.kernel_ports import own_ports_manager

OwnPortsServerKernelManager = own_ports_manager(ServerKernelManager)
SERVER_OPTION = f"--AsyncMappingKernelManager.kernel_manager_class={__name__}.OwnPortsServerKernelManager"
