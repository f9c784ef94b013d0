"""Put ``notebook_launch.notebook.cuda_tracking`` back to "nothing witnessed yet", so each test with a FAKE
CUDA build starts from a notebook that has not touched CUDA. Lives here, not in the package:
only tests need to forget what the tracker saw."""
from __future__ import annotations

from notebook_launch.notebook import cuda_tracking

_NOTHING_WITNESSED = {
    "_initialized_before_tracking": False,
    "_first_init_stack": None,
    "_first_cell": None,
    "_first_count_stack": None,
    "_first_count_cell": None,
    "_count_calls": 0,
}


def reset_cuda_tracking() -> None:
    for name, value in _NOTHING_WITNESSED.items():
        # a renamed global would otherwise be "reset" by creating a new, unused one
        assert hasattr(cuda_tracking, name), f"cuda_tracking has no {name} any more: update this helper"
        setattr(cuda_tracking, name, value)
