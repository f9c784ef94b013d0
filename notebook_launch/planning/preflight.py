"""Pre-flight checks of the notebook's state, run before any process starts: a launch
from inside a rank, an Accelerate state ranks would inherit, CUDA or the XLA runtime
already started, a busy port. Each raises GuardError (or LaunchArgumentError) with
what happened and what to do about it."""
from __future__ import annotations

import logging
import os
import sys

from ..notebook import cuda_tracking
from . import port_holders
from ..notebook.accelerate_state import find_origin, reset_for_training_arguments
from ..notebook.hooks_record import installed_by
from ..detect.platform import inside_launched_rank
from ..detect import torch_tpu
from ..detect.xla import runtime_initialized
from ..errors import GuardError, LaunchArgumentError
from .net import PortReservation, claim_any_free_port, claim_free_port
from ..notebook.notebook_streams import ERR
from ..wire.plan import StartMethod

log = logging.getLogger("notebook_launch")


def check_not_inside_rank() -> None:
    """A launch from inside a launched rank would nest process groups and deadlock. Every
    launch path (notebook_launcher, start_ranks) calls this first, and a launch that passes
    it then installs the notebook's hooks (``hooks.install``: a no-op after the first time), so
    the guards track the notebook from its first launch on even without ``%load_ext``; the
    caller does, since the hooks install the fork launcher's between-cells imports and the
    guards sit below every engine."""
    if inside_launched_rank():
        raise GuardError(
            "notebook_launcher was called from inside a launched rank. The function you launch "
            "already runs on every rank: call the training code directly there instead of "
            "launching again.")


def check_no_accelerate_state() -> None:
    """Forked ranks would inherit an existing Accelerate state and each run as a lone rank 0.
    Accelerate's own guard misses a bare PartialState. The error names what made the state and
    where (``accelerate_state.find_origin``: ``TrainingArguments`` at ``Cell In[3], line 2``).
    State made only by TrainingArguments, with no device touched, is undone for the user
    instead (``accelerate_state.reset_for_training_arguments``), saying so."""
    if "accelerate" not in sys.modules:
        return
    try:
        from accelerate.state import AcceleratorState, PartialState
    except Exception:   # why: an Accelerate that cannot be imported holds no state to check
        log.debug("accelerate.state cannot be imported; no Accelerate state to check", exc_info=True)
        return
    accelerator_state = bool(getattr(AcceleratorState, "_shared_state", None))
    if not accelerator_state and not getattr(PartialState, "_shared_state", None):
        return
    origin = find_origin(accelerator_state)
    if origin.resettable and _nothing_but_the_state_was_started():
        reset_for_training_arguments(origin.resettable)
        print("notebook_launch: reset the Accelerate state that TrainingArguments made in the notebook"
              f"{origin.describe()}; no device was touched, so each rank sets up its own.", file=ERR)
        return
    what = "an Accelerator or AcceleratorState" if accelerator_state else "a PartialState"
    makers = origin.makers
    inside = (f"Build {makers[0].name}(...) inside the function you pass to notebook_launcher"
              if makers else "Create the Accelerator (or TrainingArguments) inside the function you pass "
              "to notebook_launcher")
    raise GuardError(
        f"This notebook already holds {what}{origin.describe() or ' (created outside the launched function)'}. "
        "Every rank would inherit it and train alone as rank 0. "
        f"{inside}, then restart the kernel (or, if it touched no GPU, run "
        "`from accelerate.state import AcceleratorState; AcceleratorState._reset_state(True)`) and launch again.")


def _nothing_but_the_state_was_started() -> bool:
    """A reset is safe only while the state is all there is: no CUDA, no XLA runtime, no process group."""
    if cuda_tracking.is_cuda_initialized() or runtime_initialized() or torch_tpu.runtime_initialized():
        return False
    dist = getattr(sys.modules.get("torch"), "distributed", None)
    try:
        return not (dist is not None and dist.is_available() and dist.is_initialized())
    except Exception:   # why: a torch.distributed that cannot answer has no group to reset
        log.debug("torch.distributed.is_initialized() failed; not resetting", exc_info=True)
        return False


def check_cuda_not_initialized(start_method: StartMethod, gpus: int) -> None:
    """Forking a process that holds a CUDA context, or whose CUDA runtime was already asked
    for the device count (``torch.cuda.is_available()``: a poisoned fork, see cuda_tracking),
    gives every rank a CUDA it cannot use. Refuse, saying which line did it and what to do.
    A clean notebook then gets PYTORCH_NVML_BASED_CUDA_CHECK=1 (see
    ``cuda_tracking.prefer_nvml_availability_check``) so a later ``is_available()`` keeps it clean.

    A poisoned fork matters only to ranks that use a GPU (``gpus``: the CUDA devices the launch
    plans ranks on): on a machine with a CUDA build of torch and no GPU (Colab's and Kaggle's
    CPU runtimes) every notebook has asked ``is_available()``, and its CPU ranks never
    initialize CUDA, so it launches as it is and the notebook's environment stays as it was."""
    if start_method != "fork":
        return
    if cuda_tracking.is_cuda_initialized():
        where = cuda_tracking.where() or where_unknown("CUDA was initialized",
                                                       cuda_tracking.initialized_before_tracking())
        raise GuardError(
            "CUDA is already initialized in this notebook, so ranks cannot be forked from it "
            "(their CUDA would be unusable)."
            + f"\n{where}\n"
            + "What to do: restart the kernel and keep every CUDA call (.cuda(), .to('cuda'), "
            "torch.cuda.* queries that create a context, an Accelerator) inside the launched function; "
            "or pass start_method='spawn' so ranks start fresh (the function and its arguments are then "
            "shipped with cloudpickle); for persistent ranks, start_ranks(..., start_method='spawn') or "
            "%ranks start --spawn.")
    if gpus == 0:
        return
    if cuda_tracking.fork_is_poisoned():
        where = cuda_tracking.where_runtime_was_asked() or where_unknown(
            "the CUDA runtime was asked", cuda_tracking.runtime_asked_before_tracking())
        raise GuardError(
            "The CUDA runtime was already used in this notebook without initializing CUDA "
            "(torch.cuda.is_available(), torch.cuda.device_count() where NVML cannot answer, or "
            "another library that initialized the CUDA driver), so ranks forked from it cannot use "
            "their GPU: each would fail in torch.cuda.set_device with \"Cannot re-initialize CUDA "
            "in forked subprocess\"."
            + f"\n{where}\n"
            + NVML_ADVICE)
    cuda_tracking.prefer_nvml_availability_check()


def why_not_fork(gpus: int) -> str | None:
    """Why ranks must not be forked from this notebook (its CUDA), in words; None when they may."""
    if cuda_tracking.is_cuda_initialized():
        return "CUDA is initialized in this notebook"
    if gpus and cuda_tracking.fork_is_poisoned():
        return "the CUDA runtime was already used in this notebook"
    return None


def where_unknown(what: str, before_tracking: bool) -> str:
    """Why the guard cannot name the line: notebook_launch records it only once its hooks are
    installed (hooks.py), which ``import notebook_launch`` alone does not do."""
    how = "`%load_ext notebook_launch` (or `notebook_launch.install_hooks()`) in the first cell"
    if not cuda_tracking.tracking() or before_tracking:
        since = f" (at {installed_by()})" if installed_by() else ""
        return (f"Where {what} is unknown: it happened before notebook_launch began recording{since}; "
                f"put {how} to have this error name the line.")
    return f"Where {what} is unknown (a library below Python did it)."


NVML_ADVICE = (
    "What to do: pass start_method='spawn' so ranks start fresh (the function and its arguments are "
    "then shipped with cloudpickle): notebook_launcher(..., start_method='spawn'), and for persistent "
    "ranks start_ranks(..., start_method='spawn') or %ranks start --spawn. To keep forking: restart "
    "the kernel and run `import os; os.environ['PYTORCH_NVML_BASED_CUDA_CHECK'] = '1'` "
    "before anything calls torch.cuda.is_available(); torch then "
    "asks NVML, which leaves fork usable. Keep other CUDA queries (torch.cuda.get_device_name, "
    "mem_get_info, ...) inside the launched function.")


def check_runtime_not_initialized() -> None:
    """Ranks on TPUs (torch_xla's xmp.spawn, TorchTPU's spawned ranks) cannot start once this
    notebook started a TPU runtime: xmp.spawn refuses ("Runtime is already initialized"), forked
    replicas could not use it, and the PJRT client of either stack holds the TPU devices, which no
    rank could then claim. Refuse first, saying which stack and what to do."""
    if runtime_initialized():
        raise GuardError(
            "The XLA runtime is already initialized in this notebook (something called "
            "xm.xla_device(), torch_xla.device() or put a tensor on an XLA device outside the "
            "launched function), so torch_xla cannot start replicas from it. What to do: restart "
            "the kernel and keep every XLA call (xm.xla_device(), torch_xla.device(), .to(device), "
            "an Accelerator) inside the function you pass to notebook_launcher.")
    if torch_tpu.runtime_initialized():
        raise GuardError(
            "TorchTPU's runtime is already initialized in this notebook (torch.tpu.is_initialized() is "
            "True: a tensor was put on the 'tpu' device, or a torch.tpu call started it, outside the "
            "launched function), and it holds this machine's TPU devices, so no rank could claim its "
            "own. What to do: restart the kernel and keep every TPU call (torch.device('tpu'), "
            ".to('tpu'), model.tpu(), torch.tpu.*) inside the function you pass to notebook_launcher.")


def resolve_port(port: int, *, explicit: bool, node_rank: int, notes: list[str],
                 multi_node: bool = False) -> PortReservation:
    """Only the node that hosts the rendezvous store (node 0) needs the port free, and claims it
    among this machine's launches until the run ends (``net.PortReservation``), so two launches
    started at the same instant never both pick it. A busy default port is replaced by a free one
    (``notes`` says who holds it, unless this notebook's own ranks or runs do: port_holders); a busy
    port the user chose, or one the other nodes were told, is an error."""
    if node_rank != 0:
        return PortReservation(port, -1)   # nothing binds it here: node 0 hosts the store
    claim = claim_free_port(port)
    if claim is not None:
        return claim
    if multi_node:  # the other nodes were told this port: we cannot pick another one for them
        raise LaunchArgumentError(
            f"use_port={port} is already in use on node 0 (another launch, or a process still holding "
            f"it). Pass a free use_port, the same one on every node.")
    if explicit:
        raise LaunchArgumentError(
            f"use_port={port} is already in use on this machine (another launch, or a process "
            f"still holding it). Pass another port, or leave use_port at its default to pick a free one.")
    chosen = claim_any_free_port()
    holders = port_holders.find_holders(port, PortReservation.path(port), os.getpid())
    said = port_holders.note(port, chosen.port, holders, os.getpid())
    if said:   # nothing to say where the port is this notebook's own (its runs' ranks or claims) or no one's
        notes.append(said)
    return chosen
