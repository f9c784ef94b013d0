"""What may cross between the notebook and a rank by pickling, and where a value that cannot is.

Every value that crosses (a spawned rank's function and arguments, a persistent rank's
``run``/``push`` and what it sends back, every rank's result) is pickled by
``shared_tensors.dumps``, which asks ``reduce_handle`` here about every object first:

- an open file, pipe or socket (``io.FileIO``, the buffered and text wrappers over one,
  ``socket.socket``) is refused: it is a descriptor of this process, and the other process
  would get something else. cloudpickle would send a read-mode text file as a ``StringIO``
  of its contents (an empty one once it was read to the end) and refuse the other modes
  with a message that names no argument;
- the notebook's (or rank's) own ``sys.stdout``/``sys.stderr`` travel by name: they arrive
  as the other process's own streams, so ``print(..., file=out)`` writes to the rank's output.

``locate`` finds, when pickling failed, the innermost part of a value that does not pickle
and names its path (``args[0]["log"]``, ``result["model"].layers[2].lock``), so an error can
say which value to change.
"""
from __future__ import annotations

import io
import pickle
import socket
import sys
import types
from typing import Any, Iterator

# The classes that hold a descriptor of this process (subclasses too, unless they say how to
# pickle themselves: an fsspec file that reopens its path on the other side is fine).
_DESCRIPTOR_CLASSES: tuple[type, ...] = (io.FileIO, io.BufferedReader, io.BufferedWriter, io.BufferedRandom,
                                         io.BufferedRWPair, io.TextIOWrapper, socket.socket)
_STREAM_NAMES = ("stdout", "stderr", "__stdout__", "__stderr__")


class UnsendableValueError(pickle.PicklingError):
    """A value that holds something of this process only (an open file, a socket)."""


class DeviceTensorError(UnsendableValueError):
    """A tensor on an accelerator (CUDA, XPU, ...) in what a fresh rank is sent: it would arrive as
    a CPU copy, not on the rank's device (``locate(..., refuse_devices=True)``)."""


def tensor_device(tensor: Any) -> str:
    """The device a tensor lives on, as a string (``"cuda:0"``, ``"cpu"``)."""
    return str(tensor.device)


def _refuse_device_tensor(obj: Any) -> None:
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(obj, torch.Tensor):
        return
    device = tensor_device(obj)
    if device.split(":")[0] not in ("cpu", "meta"):
        raise DeviceTensorError(f"a tensor on {device} (shape {tuple(obj.shape)}, {obj.dtype})")


def _own_reduction(cls: type) -> bool:
    """Whether ``cls`` (a subclass of a descriptor class) says how it is pickled."""
    for klass in cls.__mro__:
        if klass in _DESCRIPTOR_CLASSES or klass is object:
            return False
        if any(name in vars(klass) for name in ("__reduce__", "__reduce_ex__", "__getstate__")):
            return True
    return False


def describe_handle(obj: Any) -> str:
    """``obj`` in words: its kind, name and mode, for an error."""
    if isinstance(obj, socket.socket):
        try:
            return f"an open socket ({obj.family.name}, fd {obj.fileno()})"
        except (OSError, ValueError):
            return "a socket"
    closed = getattr(obj, "closed", False)
    name = getattr(obj, "name", None)
    mode = getattr(obj, "mode", None)
    details = ", ".join(part for part in (f"name={name!r}" if name is not None else "",
                                           f"mode={mode!r}" if mode is not None else "") if part)
    kind = "a closed file" if closed else "an open file"
    return f"{kind} ({type(obj).__module__}.{type(obj).__qualname__}{', ' + details if details else ''})"


DYNAMIC_CODE = "<dynamic-code>"   # cloudpickle >= 3.1.3's co_filename for every code object it ships


def reduce_code(obj: Any) -> Any:
    """For a pickler's ``reducer_override``: cloudpickle's reduction of a code object with its
    ``co_filename`` kept; NotImplemented for anything else. cloudpickle 3.1.3 ships every code
    object as if from ``<dynamic-code>`` (a deterministic payload), so a function defined in a
    cell would run in a spawned or Ray rank with frames no one can place: its traceback, the hang
    verdict and the "Cell In[5], line 12" labels need the file its code came from."""
    if not isinstance(obj, types.CodeType):
        return NotImplemented
    from cloudpickle import cloudpickle as implementation
    code_reduce = getattr(implementation, "_code_reduce", None)
    if code_reduce is None:
        return NotImplemented
    reduced = code_reduce(obj)
    args = reduced[1]
    if DYNAMIC_CODE not in args:
        return reduced
    kept = tuple(obj.co_filename if isinstance(arg, str) and arg == DYNAMIC_CODE else arg for arg in args)
    return (reduced[0], kept, *reduced[2:])


def reduce_handle(obj: Any) -> Any:
    """For a pickler's ``reducer_override``: a reduction for the process's standard streams,
    an UnsendableValueError for an open file or socket, NotImplemented for anything else."""
    if not isinstance(obj, (io.IOBase, socket.socket)):
        return NotImplemented
    for name in _STREAM_NAMES:
        if obj is getattr(sys, name, None):
            return getattr, (sys, name)
    if isinstance(obj, _DESCRIPTOR_CLASSES) and not _own_reduction(type(obj)):
        raise UnsendableValueError(
            f"{describe_handle(obj)} cannot be sent to or from a rank: it is a descriptor of one "
            f"process, meaningless in another. Pass what it was opened from (a path, an address) "
            f"and open it inside the function; to return data, read it into bytes or a str first.")
    return NotImplemented


class Pickler:
    """cloudpickle's Pickler with ``reduce_handle`` first (made lazily: cloudpickle is imported
    only when something is pickled)."""

    _cls: type | None = None

    @classmethod
    def get(cls) -> type:
        if cls._cls is None:
            import cloudpickle

            class HandleRefusingPickler(cloudpickle.Pickler):
                def reducer_override(self, obj: Any) -> Any:
                    reduced = reduce_handle(obj)
                    return reduced if reduced is not NotImplemented else super().reducer_override(obj)

            cls._cls = HandleRefusingPickler
        return cls._cls


class _Sink:
    """A file that forgets what is written: probing needs the failure, not the bytes."""

    def write(self, data: Any) -> int:
        return memoryview(data).nbytes   # a PickleBuffer too: the pickler writes a big one as it is


def _probe_pickler(refuse_devices: bool = False) -> type:
    base = Pickler.get()

    class ProbePickler(base):  # type: ignore[misc,valid-type]
        def reducer_override(self, obj: Any) -> Any:
            if refuse_devices:
                _refuse_device_tensor(obj)
            torch = sys.modules.get("torch")
            if torch is not None and isinstance(obj, (torch.storage.TypedStorage, torch.UntypedStorage)):
                return bytes, ()   # a storage's bytes never decide whether a value pickles
            numpy = sys.modules.get("numpy")
            if numpy is not None and type(obj) is numpy.ndarray and not obj.dtype.hasobject:
                return bytes, ()   # nor do an array's (unless they are objects)
            return super().reducer_override(obj)

    return ProbePickler


def pickle_error(value: Any, refuse_devices: bool = False) -> Exception | None:
    """Why ``value`` does not pickle (as ``shared_tensors.dumps`` would), or None if it does.
    Cheap for big tensors and numpy arrays: their bytes are not copied. ``refuse_devices``: a
    tensor on an accelerator is an error too (DeviceTensorError)."""
    try:
        _probe_pickler(refuse_devices)(_Sink(), protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    except Exception as exc:   # why: RecursionError too
        return exc
    return None


def check(value: Any, name: str) -> None:
    """Raise UnsendableValueError naming the part of ``value`` (called ``name``) that does not
    pickle; nothing if it does. For code that must refuse before sending, e.g. ``%%ranks``."""
    found = locate(value, name)
    if found is not None:
        path, part, exc = found
        raise UnsendableValueError(f"{path} ({type(part).__module__}.{type(part).__qualname__}) cannot be "
                                   f"pickled: {type(exc).__name__}: {exc}") from exc


def locate(value: Any, name: str, refuse_devices: bool = False) -> tuple[str, Any, Exception] | None:
    """(path, part, error) for the innermost part of ``value`` that does not pickle, its path
    written from ``name`` (``name["key"][2].attribute``); None if ``value`` pickles. With
    ``refuse_devices``, a tensor on an accelerator counts as a part that does not pickle."""
    error = pickle_error(value, refuse_devices)
    if error is None:
        return None
    path, current, seen = name, value, {id(value)}
    while True:
        for suffix, child in _children(current):
            if id(child) in seen:
                continue
            child_error = pickle_error(child, refuse_devices)
            if child_error is not None:
                seen.add(id(child))
                path, current, error = path + suffix, child, child_error
                break
        else:
            return path, current, error


def _children(obj: Any) -> Iterator[tuple[str, Any]]:
    """The parts of ``obj`` a pickle of it would hold, each with how its path goes on."""
    if isinstance(obj, dict):
        for key, item in list(obj.items()):
            yield f"[{key!r}]", item
        return
    if isinstance(obj, (list, tuple)):
        for index, item in enumerate(obj):
            yield f"[{index}]", item
        return
    if isinstance(obj, (set, frozenset)):
        for item in list(obj):
            yield f" (an element {item!r:.40})", item
        return
    if isinstance(obj, types.FunctionType):   # what cloudpickle sends of a function by value
        for name, cell in zip(obj.__code__.co_freevars, obj.__closure__ or ()):
            try:
                yield f" (its closure variable {name!r})", cell.cell_contents
            except ValueError:   # an empty cell: nothing to send
                continue
        for name in obj.__code__.co_names:
            if name in obj.__globals__:
                yield f" (the global {name!r} it uses)", obj.__globals__[name]
        return
    torch = sys.modules.get("torch")
    state = getattr(obj, "__dict__", None)
    if torch is not None and isinstance(obj, torch.nn.Module) and isinstance(state, dict):
        for group in ("_modules", "_parameters", "_buffers"):
            for key, item in (state.get(group) or {}).items():
                yield (f"[{key}]" if key.isdigit() else f".{key}"), item
        state = {k: v for k, v in state.items() if k not in ("_modules", "_parameters", "_buffers")}
    if isinstance(state, dict):
        for key, item in list(state.items()):
            yield f".{key}", item
    for slot in _slots(type(obj)):
        if hasattr(obj, slot):
            yield f".{slot}", getattr(obj, slot)


def _slots(cls: type) -> list[str]:
    names: list[str] = []
    for klass in cls.__mro__:
        slots = vars(klass).get("__slots__", ())
        names += [slots] if isinstance(slots, str) else [s for s in slots if s not in ("__dict__", "__weakref__")]
    return names
