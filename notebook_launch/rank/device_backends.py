"""A rank forked by a warm start process that imported torch without its device backends loads them
itself, once its own environment is in place: it then has what ``import torch`` gives a fresh
Python (torch's ``torch.backends`` entry points: torch_tpu, ...), read with the rank's variables.

Why the start process withholds them (``engines.local.start_client.withhold_device_backends``): on a
machine with TPU devices, ``import torch`` loads torch_tpu, which sets the device up and reads its
environment through C++ readers that keep the first value they see (``GetEnvOnce``); a rank forked
from there would keep the start process's values (no slicebuilder address, no topology) instead of
its own, and might inherit device state TorchTPU refuses in a forked child.
"""
from __future__ import annotations

import os

from ..wire import protocol

FLAG = "--load-device-backends"   # spawn_entry's argument that asks for it


def load(writer: protocol.EventWriter) -> bool:
    """Load torch's device backends as ``import torch`` does where TORCH_DEVICE_BACKEND_AUTOLOAD
    allows it (its default); False after reporting an error as the rank's."""
    import torch
    if not torch._is_device_backend_autoload_enabled():
        return True
    try:
        torch._import_device_backends()
    except Exception as exc:   # why: a backend that cannot load is this rank's error, said with its cause
        cause = exc.__cause__ or exc
        writer.send(protocol.ERROR, protocol.error_payload(exc, message=(
            f"rank {os.environ.get('RANK', '?')} could not load torch's device backends "
            f"({type(cause).__name__}: {cause}): {exc}. A fresh Python fails the same way at "
            f"`import torch`. What to do: check the backend's installation (pip show torch_tpu "
            f"libtpu; its torch version range), or set TORCH_DEVICE_BACKEND_AUTOLOAD=0 in the "
            f"notebook if the ranks do not need it.")))
        return False
    return True

