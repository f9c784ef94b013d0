"""Every error notebook_launch raises in the notebook is a ``NotebookLaunchError`` (one
``except`` catches them all) and keeps the builtin base it always had, so code written
against ``except ValueError`` / ``except RuntimeError`` / ``except ChildFailedError``
still catches what it caught."""
from __future__ import annotations

import pytest
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

import notebook_launch
from notebook_launch import GuardError, LaunchArgumentError, LaunchError, NotebookLaunchError

KEPT_BASES = {
    LaunchError: (RuntimeError, ChildFailedError),
    GuardError: (RuntimeError,),
    LaunchArgumentError: (ValueError,),
}


def public_errors() -> list[type]:
    return [value for name in notebook_launch.__all__
            if isinstance(value := getattr(notebook_launch, name), type) and issubclass(value, BaseException)]


def test_every_public_error_is_listed_here():
    assert set(public_errors()) == set(KEPT_BASES) | {NotebookLaunchError}


@pytest.mark.parametrize("error", list(KEPT_BASES))
def test_every_public_error_is_a_notebook_launch_error_and_keeps_its_bases(error):
    assert issubclass(error, NotebookLaunchError)
    for base in KEPT_BASES[error]:
        assert issubclass(error, base), (error, base)


@pytest.mark.parametrize("error, base", [(e, b) for e, bases in KEPT_BASES.items() for b in bases])
def test_old_handlers_still_catch(error, base):
    with pytest.raises(base):
        raise error("boom")
    with pytest.raises(NotebookLaunchError):
        raise error("boom")


def test_the_base_catches_each_but_is_no_builtin_error():
    """``except NotebookLaunchError`` is specific to us: no user ValueError falls into it."""
    assert not issubclass(NotebookLaunchError, (RuntimeError, ValueError))
    assert not issubclass(ValueError, NotebookLaunchError)


def test_launch_error_keeps_its_fields_and_message():
    err = LaunchError("rank 1 failed: ValueError: boom", rank=1, kind="exception", log_dir="/tmp/x")
    assert str(err) == "rank 1 failed: ValueError: boom"
    assert (err.rank, err.kind, err.log_dir, err.failures) == (1, "exception", "/tmp/x", {})


@pytest.mark.parametrize("error", list(KEPT_BASES))
def test_every_error_renders_in_ipython(error):
    """IPython asks ``_render_traceback_``: each shows its name and message, no frames of ours."""
    lines = error("what happened; what to do")._render_traceback_()
    assert error.__name__ in lines[0] and "what happened; what to do" in lines[0]
