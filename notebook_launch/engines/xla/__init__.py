"""torch_xla's engine: xmp.spawn's launcher and its replicas' records."""
