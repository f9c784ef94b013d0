"""find_executable_batch_size whatever the shape of the call (issue 44): on some ranks only (an
evaluation under ``if rank == 0:``), nested, called twice, from different starting sizes, with a
rank failing inside it (and catching its error). Every rank ends quickly with one size or one
clear error: before, a call on one rank waited in the store for the other's end until the
launch's timeout, and ranks with different starting sizes each kept their own.

Real launches of 2 ranks with gloo; an allocation fails for real (``bytearray`` of 2**62 bytes
raises ``MemoryError`` at once) above the size a rank "fits". Each launch has a timeout far above
what it takes, and a test fails if the launch ends by it (``LaunchError.kind == "timeout"``)."""
from __future__ import annotations

import pytest

from helpers.only_users_code import traces_of_ours
from notebook_launch import LaunchError, find_executable_batch_size, notebook_launcher
from notebook_launch.planning.net import free_port

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

TIMEOUT = 25   # seconds: a launch that waits for it failed the test (each takes a few seconds)


def launch(function, log_dir: str, args: tuple = ()):
    return notebook_launcher(function, args=args, num_processes=2, log_dir=log_dir, ui="text",
                             use_port=str(free_port()), start_method="fork", timeout=TIMEOUT)


def allocate(batch_size: int, fits: int) -> int:
    """A real allocation failure (Python's MemoryError) when ``batch_size`` is above ``fits``."""
    bytearray(2**62 if batch_size > fits else 16)
    return batch_size


def evaluate_on(caller: int, fits: int) -> list:
    """``caller`` alone evaluates (running out of memory above ``fits``) while the other rank
    waits in a barrier; then both train together, rank 1 fitting 42 items."""
    dist.init_process_group("gloo")
    rank = dist.get_rank()

    @find_executable_batch_size(starting_batch_size=64)
    def evaluation(batch_size: int) -> int:
        return allocate(batch_size, fits)

    @find_executable_batch_size(starting_batch_size=64)
    def training(batch_size: int) -> int:
        dist.barrier()
        allocate(batch_size, 42 if rank == 1 else 64)
        dist.all_reduce(torch.ones(1))
        return batch_size

    evaluated = evaluation() if rank == caller else None
    dist.barrier()
    return [evaluated, training()]


@pytest.mark.parametrize("caller", [0, 1])
def test_a_call_on_one_rank_returns_without_waiting_for_the_others(log_dir, caller):
    """Per rank, as Accelerate's: the evaluation backs off alone (64, 57, 51, 45) and returns;
    the training that follows, on both ranks, still agrees (on 40, what fits rank 1)."""
    results = launch(evaluate_on, log_dir, args=(caller, 50))
    assert results[caller] == [45, 40]
    assert results[1 - caller] == [None, 40]


def nested(fits_inner_on_rank_0: int) -> list:
    """A training on both ranks whose every attempt evaluates on rank 0 alone (nested)."""
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    evaluated: list[int] = []

    @find_executable_batch_size(starting_batch_size=32)
    def training(batch_size: int) -> int:
        @find_executable_batch_size(starting_batch_size=batch_size)
        def evaluation(size: int) -> int:
            return allocate(size, fits_inner_on_rank_0)

        dist.barrier()
        if rank == 0:
            evaluated.append(evaluation())
        allocate(batch_size, 20 if rank == 1 else 64)
        dist.all_reduce(torch.ones(1))
        return batch_size

    found = training()
    dist.barrier()
    return [found, evaluated]


def test_a_nested_call_on_one_rank_inside_a_call_on_all(log_dir):
    results = launch(nested, log_dir, args=(25,))
    assert results[0][0] == results[1][0] == 19   # 32, 28, 25, 22, 19: what fits rank 1
    assert results[1][1] == []
    assert results[0][1] == [25, 25, 25, 22, 19]   # each attempt's evaluation, from its size


def twice() -> list:
    """The same decorated function called twice on both ranks: the second call is an agreement of
    its own (rank 1 fits less the second time), starting from the size the first agreed on."""
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    budgets = iter([[64, 50], [64, 40]])

    @find_executable_batch_size(starting_batch_size=64)
    def step(batch_size: int, fits: list) -> int:
        dist.barrier()
        allocate(batch_size, fits[rank])
        dist.all_reduce(torch.ones(1))
        return batch_size

    return [step(next(budgets)), step(next(budgets))]


def test_calling_twice_agrees_twice(log_dir):
    assert launch(twice, log_dir) == [[45, 40], [45, 40]]


def different_starts() -> int:
    dist.init_process_group("gloo")

    @find_executable_batch_size(starting_batch_size=[128, 100][dist.get_rank()])
    def step(batch_size: int) -> int:
        dist.barrier()
        return batch_size

    return step()


def test_different_starting_sizes_are_one_clear_error(log_dir):
    """Not ``[128, 100]`` (each rank its own): the error names each rank's starting size."""
    with pytest.raises(LaunchError) as info:
        launch(different_starts, log_dir)
    assert info.value.kind != "timeout", str(info.value)
    assert info.value.exc_type == "ValueError"
    assert "rank 0: 128, rank 1: 100" in str(info.value)
    assert "same starting_batch_size" in str(info.value)


def catches_its_own_error(failing: int) -> str:
    """``failing`` raises a bug inside the finder and catches it, going on as if nothing happened:
    the other rank, whose attempt fit, must end with an error that names it, not wait."""
    dist.init_process_group("gloo")
    rank = dist.get_rank()

    @find_executable_batch_size(starting_batch_size=8)
    def step(batch_size: int) -> int:
        dist.barrier()
        if rank == failing:
            raise ValueError(f"a bug at batch size {batch_size}")
        return batch_size

    try:
        step()
    except ValueError:
        if rank != failing:
            raise
        return "caught"
    return "returned"


@pytest.mark.parametrize("failing", [0, 1])
def test_a_rank_failing_inside_ends_its_peers_with_that_error(log_dir, failing):
    with pytest.raises(LaunchError) as info:
        launch(catches_its_own_error, log_dir, args=(failing,))
    assert info.value.kind != "timeout", str(info.value)
    assert info.value.rank == 1 - failing
    assert f"rank {failing} failed inside find_executable_batch_size" in str(info.value)
    assert "ValueError: a bug at batch size 8" in str(info.value)


def fails_inside() -> None:
    dist.init_process_group("gloo")

    @find_executable_batch_size(starting_batch_size=8)
    def step(batch_size: int) -> None:
        dist.barrier()
        raise ValueError(f"a bug at batch size {batch_size}")

    step()


def test_a_ranks_traceback_shows_the_users_frames_not_ours(log_dir):
    with pytest.raises(LaunchError) as info:
        launch(fails_inside, log_dir)
    traceback = info.value.remote_traceback or ""
    assert "in fails_inside" in traceback and "in step" in traceback, traceback
    assert traces_of_ours(traceback) == [], traceback


def test_outside_a_launch_only_the_decorators_hidden_frame_is_ours():
    """IPython and pytest leave out a frame with ``__tracebackhide__``; no other frame of ours."""
    def step(batch_size: int) -> None:
        allocate(batch_size, 10)
        raise ValueError(f"a bug at batch size {batch_size}")

    with pytest.raises(ValueError, match="a bug at batch size 10") as info:
        find_executable_batch_size(step, starting_batch_size=12)()
    ours = [frame for frame, _ in walk(info.value.__traceback__) if traces_of_ours(frame.f_code.co_filename)]
    assert all(frame.f_locals.get("__tracebackhide__") for frame in ours), [f.f_code.co_name for f in ours]
    assert len(ours) == 1


def walk(traceback):
    while traceback is not None:
        yield traceback.tb_frame, traceback.tb_lineno
        traceback = traceback.tb_next
