"""torch_xla's engine: xmp.spawn's launcher (``launcher.XlaBackend``); its replicas' records are the rank's
(``engines.xla.replicas``) and diagnosis's (``engines.xla.replica_whereabouts``), which read them.

Owns: starting torch_xla's replicas. May import: ``engines.base``, ``engines.local``'s fork launcher (the
replicas' parent is forked as a fork launch's rank is), the plan, the rank side, diagnosis.
"""
