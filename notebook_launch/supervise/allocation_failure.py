"""What ran out when a rank's allocation failed, in words: the size asked, what the device or the
rank held, what to do.

Whether an exception is an allocation failure is its type's to say, decided in the rank
(``memory_errors.out_of_memory_type``, sent as the ERROR's ``out_of_memory``). The message is read
here only for the figures it carries, once the type said so: a ``ValueError`` that quotes torch's
"you tried to allocate N bytes" is not called out of memory, and a ``torch.OutOfMemoryError`` is
named as itself, never as Python's ``MemoryError``.
"""
from __future__ import annotations

import re

from ..wire.memory_errors import is_python_memory_error
from ..record.proc_usage import machine_memory
from ..record.resources import size_text

ADVICE = ("What to do: start fewer ranks (num_processes); load the model in the notebook before the launch, "
          "so that forked ranks share its memory instead of each loading a copy; use a smaller batch.")
CUDA_ADVICE = ("What to do: a smaller batch; free what the rank no longer needs (del, then torch.cuda.empty_cache()); "
               "one rank per GPU; where much is reserved but unallocated, set "
               "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before the launch.")
CUDA_OOM = "CUDA out of memory"
CUDA_ASKED = re.compile(r"CUDA out of memory\. Tried to allocate ([\d.]+ [KMGT]?i?B)")
CUDA_NEW = re.compile(r"GPU (\d+) has a total capacity of ([\d.]+ [KMGT]?i?B) of which ([\d.]+ [KMGT]?i?B) is free")
CUDA_PROCESS = re.compile(r"this process has ([\d.]+ [KMGT]?i?B) memory in use")
CUDA_TORCH = re.compile(r"([\d.]+ [KMGT]?i?B) is allocated by PyTorch, and ([\d.]+ [KMGT]?i?B) is reserved by "
                        r"PyTorch but unallocated")
CUDA_OLD = re.compile(r"\(GPU (\d+); ([\d.]+ [KMGT]?i?B) total capacity; ([\d.]+ [KMGT]?i?B) already allocated; "
                      r"([\d.]+ [KMGT]?i?B) free; ([\d.]+ [KMGT]?i?B) reserved in total by PyTorch")
CPU_ASKED = re.compile(r"you tried to allocate (\d+) bytes")
# the whole shape ("(65536, 65536)": it was cut at its first space, "(65536,") and the dtype
NUMPY_ASKED = re.compile(r"Unable to allocate ([\d.]+ [KMGTPE]?i?B) for an array with shape (\([^)]*\))"
                         r"(?: and data type (\w+))?")


def machine_text() -> str:
    """'the machine: 12.7 GiB in all, 0.4 GiB available now' ('' where /proc/meminfo cannot be read)."""
    machine = machine_memory()
    if machine is None:
        return ""
    available = f", {size_text(machine.available)} available now" if machine.available is not None else ""
    return f"the machine: {size_text(machine.total)} in all{available}"


def allocation_text(out_of_memory: str | None, message: str, rank: int, holding: str) -> str | None:
    """The paragraph that says what ran out; None when the exception is not an allocation failure
    (``out_of_memory``: its out-of-memory class, as the rank named it; None: it is none)."""
    if out_of_memory is None:
        return None
    if CUDA_OOM in message:
        return gpu_text(message, rank)
    held = f"; {holding}" if holding else ""
    cpu, array = CPU_ASKED.search(message), NUMPY_ASKED.search(message)
    if cpu:
        asked = f"it asked for {size_text(int(cpu.group(1)))} ({int(cpu.group(1)):,} bytes)"
    elif array:
        dtype = f" of {array.group(3)}" if array.group(3) else ""
        asked = f"it asked for {array.group(1)} (an array of shape {array.group(2)}{dtype})"
    elif is_python_memory_error(out_of_memory):
        asked = "the size asked is not in the message (Python's MemoryError does not say it)"
    else:
        asked = f"the size asked is not in the message ({out_of_memory} does not say it)"
    machine = machine_text()
    return (f"rank {rank} ran out of memory: {asked}{held}" + (f"; {machine}" if machine else "")
            + ".\n" + ADVICE)


def gpu_text(message: str, rank: int) -> str:
    """torch's CUDA out-of-memory message (torch 2.1 and later, and before) in a sentence."""
    tried = CUDA_ASKED.search(message)
    device = ""
    new, old = CUDA_NEW.search(message), CUDA_OLD.search(message)
    if new:
        device = f"; GPU {new.group(1)} has {new.group(2)} in all, {new.group(3)} free"
        process, torch_held = CUDA_PROCESS.search(message), CUDA_TORCH.search(message)
        if process:
            device += f"; this rank's process held {process.group(1)} of it"
        if torch_held:
            device += (f" ({torch_held.group(1)} allocated by PyTorch, {torch_held.group(2)} reserved by "
                       f"PyTorch but unallocated)")
    elif old:
        device = (f"; GPU {old.group(1)} has {old.group(2)} in all, {old.group(4)} free; PyTorch had "
                  f"{old.group(3)} allocated, {old.group(5)} reserved")
    what = f"it asked for {tried.group(1)}" if tried else "the size asked is not in the message"
    return f"rank {rank} ran out of GPU memory: {what}{device}.\n{CUDA_ADVICE}"
