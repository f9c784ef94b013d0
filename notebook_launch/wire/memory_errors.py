"""Which exceptions are an allocation that failed: decided by the exception's type, in the rank
that raised it, and said by the type's own name.

Why by type and here: a message is anybody's text. A ``ValueError`` whose message quotes torch's
"you tried to allocate N bytes" (a user's check, a library's validation) ran out of nothing; a
``torch.OutOfMemoryError`` is not Python's ``MemoryError`` and must not be called that. Only the
rank holds the exception object, so it decides (``protocol.error_payload`` sends the answer as
``out_of_memory``), and the notebook parses the message only for the size asked, once the type said
it was an allocation failure. Nothing is imported: the classes are known by their module and name,
so a rank without torch, numpy or TensorFlow pays nothing.

Standard library only: both sides import it.
"""
from __future__ import annotations

# (top-level module, class name) of the accelerator libraries' out-of-memory exceptions:
# torch.OutOfMemoryError (torch.cuda.OutOfMemoryError is the same class: CUDA, ROCm, MPS, XPU) and
# TensorFlow's ResourceExhaustedError (an allocation on the device that failed)
ACCELERATOR_TYPES = frozenset({("torch", "OutOfMemoryError"), ("tensorflow", "ResourceExhaustedError")})
# torch's CPU allocator raises a bare RuntimeError (c10::Error) whose message starts with its own
# name: the one allocation failure whose type alone cannot say it (torch 2.8 to 2.13 at least)
TORCH_CPU_ALLOCATOR = "DefaultCPUAllocator: can't allocate memory"
PYTHON_MEMORY_ERROR = "MemoryError"


def type_name(cls: type) -> str:
    """``cls`` as it is written in code: "MemoryError", "torch.OutOfMemoryError"."""
    module = getattr(cls, "__module__", "") or ""
    return cls.__qualname__ if module == "builtins" else f"{module}.{cls.__qualname__}"


def out_of_memory_type(exc: BaseException) -> str | None:
    """The name of the out-of-memory class ``exc`` is ("MemoryError", "torch.OutOfMemoryError",
    "numpy._core._exceptions._ArrayMemoryError", "RuntimeError" for torch's CPU allocator), None
    when it is not an allocation failure, whatever its message says."""
    cls = type(exc)
    for base in cls.__mro__:
        if base is MemoryError:
            return type_name(cls)
        module = (getattr(base, "__module__", "") or "").partition(".")[0]
        if (module, base.__name__) in ACCELERATOR_TYPES:
            return type_name(cls)
    if cls is RuntimeError and exc.args and isinstance(exc.args[0], str) and TORCH_CPU_ALLOCATOR in exc.args[0]:
        return type_name(cls)
    return None


def is_python_memory_error(name: str) -> bool:
    """Whether ``name`` (``out_of_memory_type``'s answer) is Python's own MemoryError."""
    return name == PYTHON_MEMORY_ERROR
