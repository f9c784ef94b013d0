"""find_executable_batch_size agreed on by every rank (issue 34, item 3): real launches, real gloo,
real DDP steps, and real allocation failures: each rank caps its own address space
(``RLIMIT_AS``) so that a batch past its budget fails in torch's allocator, as on a full host.

Accelerate's own decorator, with one rank out of memory and the other not, leaves the group hung
(the run ends in the timeout's verdict); ours makes every rank back off together and all end with
the same batch size: the largest that fits the rank with the least memory."""
from __future__ import annotations

import logging
import resource
from typing import Literal

import pytest

from notebook_launch import LaunchError, find_executable_batch_size, notebook_launcher
from notebook_launch.planning.net import free_port

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
accelerate_memory = pytest.importorskip("accelerate.utils.memory")

ITEM = 16 * 2**20           # bytes of input one batch item takes
HEADROOM = 256 * 2**20     # for what an attempt maps besides its batch (gloo threads' stacks, arenas)
START = 64


def mapped_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmSize in /proc/self/status")


def cap_address_space(items: int) -> None:
    """From now on this rank can map what it has, the headroom, and ``items`` batch items."""
    limit = mapped_bytes() + HEADROOM + items * ITEM
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))


def uncap_address_space() -> None:
    """Once the finder returned: the rank's next counted collective starts notebook_launch's
    progress thread, whose stack and malloc arena did not always fit under the cap ("can't start
    new thread" in the barrier after the finder, about one run in two on a loaded machine)."""
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    resource.setrlimit(resource.RLIMIT_AS, (hard, hard))


def ddp_step(batch_size: int) -> None:
    """One real DDP training step on a batch of ``batch_size`` items of ITEM bytes each: the
    model's construction broadcasts, the backward all_reduces (the collectives a peer waits in)."""
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 1))
    batch = torch.empty(batch_size, ITEM // 64, 16)   # 4-byte floats: ITEM bytes an item
    model(batch[:, :1]).sum().backward()
    del batch


class KeptGroup(AssertionError):
    """Our finder said that a failed attempt's group is still referenced after it left it: the
    peer blocked in a collective with this rank then waits for the group's timeout (gloo's is 30
    minutes), so the rank fails at once instead, with that message."""


def refuse_a_kept_group(record: logging.LogRecord) -> bool:
    if "still referenced" in record.getMessage():
        raise KeptGroup(record.getMessage())
    return True


def budgets_of(items_per_rank: list[int], decorator):
    """The launched function: rank r can hold ``items_per_rank[r]`` items; returns the batch sizes
    this rank tried (and whether each failed here), the one it ended with, and the sum over the
    ranks of a 1 by ``summed``, whose default group (``dist.group.WORLD`` when it was defined)
    is the first attempt's: a reference the failed attempt's group must not be kept alive by
    (in a spawned rank torch's ``torch.distributed.nn.functional``, imported by DDP's
    construction, has ten such defaults too), and afterwards the default group."""
    def train() -> dict:
        logging.getLogger("notebook_launch").addFilter(refuse_a_kept_group)
        dist.init_process_group("gloo")

        def summed(tensor, group=dist.group.WORLD):
            dist.all_reduce(tensor, group=group)
            return tensor

        rank = dist.get_rank()
        tried: list[tuple[int, str]] = []
        cap_address_space(items_per_rank[rank])

        @decorator(starting_batch_size=START)
        def inner(batch_size: int) -> int:
            tried.append((batch_size, "trying"))
            try:
                ddp_step(batch_size)
            except RuntimeError as error:
                tried[-1] = (batch_size, "out of memory" if "can't allocate memory" in str(error) else "failed")
                raise
            tried[-1] = (batch_size, "fit")
            return batch_size

        found = inner()
        uncap_address_space()
        dist.barrier()
        return {"found": found, "tried": tried, "summed": summed(torch.ones(1)).item()}
    return train


def launch(train, n: int, log_dir: str, start_method: Literal["fork", "spawn"] = "fork", **options):
    return notebook_launcher(train, num_processes=n, log_dir=log_dir, ui="text", use_port=str(free_port()),
                             start_method=start_method, **options)


def test_accelerates_decorator_leaves_the_group_hung_when_one_rank_runs_out_of_memory(log_dir):
    """Rank 1 backs off alone; rank 0 fit and waits for a collective rank 1 never joins."""
    train = budgets_of([START * 2, START // 2], accelerate_memory.find_executable_batch_size)
    with pytest.raises(LaunchError) as info:
        launch(train, 2, log_dir, timeout=30)
    assert info.value.kind == "timeout", str(info.value)


def sizes_from(start: int) -> list[int]:
    """The batch sizes the default reduction tries, Accelerate's 90% steps."""
    sizes = [start]
    while sizes[-1] > 1:
        sizes.append(int(sizes[-1] * 0.9))
    return sizes


def check_agreed(results: list[dict], items_per_rank: list[int]) -> None:
    found = {result["found"] for result in results}
    assert len(found) == 1, results                      # every rank ends with the same batch size
    size = found.pop()
    tried = [[s for s, _ in result["tried"]] for result in results]
    assert all(t == tried[0] for t in tried), tried      # and tried the same ones, in step
    assert tried[0] == sizes_from(START)[:len(tried[0])]
    assert size < START
    smallest = min(range(len(items_per_rank)), key=items_per_rank.__getitem__)
    ends = dict(results[smallest]["tried"])
    assert ends[size] == "fit"
    before = tried[0][tried[0].index(size) - 1]
    assert ends[before] == "out of memory", results  # the largest that fits the smallest rank
    for result in results:
        assert result["tried"][-1] == (size, "fit")
        assert result["summed"] == len(items_per_rank)


def test_ours_makes_both_ranks_back_off_together(log_dir):
    items = [START * 2, START // 2]
    results = launch(budgets_of(items, find_executable_batch_size), 2, log_dir, timeout=300)
    check_agreed(results, items)


def test_spawned_ranks_back_off_together_without_waiting_for_the_groups_timeout(log_dir):
    """In a spawned rank, DDP's construction first imports torch.distributed.nn.functional inside
    the first attempt: its defaults held the failed attempt's group, and the rank that fit waited
    in DDP's all_reduce for gloo's 30-minute timeout (``refuse_a_kept_group`` fails it at once)."""
    items = [START * 2, START // 2]
    results = launch(budgets_of(items, find_executable_batch_size), 2, log_dir, start_method="spawn", timeout=300)
    check_agreed(results, items)


def test_four_ranks_with_different_memory_agree_on_what_fits_the_smallest(log_dir):
    items = [START * 2, START // 3, START * 3, START // 2]
    results = launch(budgets_of(items, find_executable_batch_size), 4, log_dir, timeout=300)
    check_agreed(results, items)
    assert "out of memory" not in dict(results[2]["tried"]).values()   # rank 2 had room, and backed off with all


def with_an_accelerator(items_per_rank: list[int]) -> int:
    """Accelerate's usual shape: the Accelerator made first, the model prepared inside, and here
    kept outside the attempt too (as a trainer's attribute would): the failed attempt's DDP model
    outlives it, and its group must still go (the decorator disarms the model) for peers to fail."""
    from accelerate import Accelerator
    accelerator = Accelerator()
    cap_address_space(items_per_rank[accelerator.process_index])
    kept = []

    @find_executable_batch_size(starting_batch_size=START)
    def inner(batch_size: int) -> int:
        model = accelerator.prepare(torch.nn.Linear(16, 1))
        kept.append(model)
        batch = torch.empty(batch_size, ITEM // 64, 16)
        accelerator.backward(model(batch[:, :1]).sum())
        return batch_size

    found = inner()
    uncap_address_space()
    accelerator.wait_for_everyone()
    return found


def test_inside_an_accelerator_whose_prepared_models_outlive_the_attempt(log_dir):
    found = launch(with_an_accelerator, 2, log_dir, args=([START * 2, START // 2],), timeout=300)
    assert found[0] == found[1] < START, found


def fails_on_rank_1():
    dist.init_process_group("gloo")

    @find_executable_batch_size(starting_batch_size=8)
    def inner(batch_size: int) -> None:
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
        if dist.get_rank() == 1:
            raise ValueError(f"a bug at batch size {batch_size}")
        model(torch.ones(batch_size, 4)).sum().backward()

    inner()


def test_an_error_that_is_not_out_of_memory_is_a_rank_failure(log_dir):
    with pytest.raises(LaunchError) as info:
        launch(fails_on_rank_1, 2, log_dir, timeout=300)
    assert info.value.kind != "timeout", str(info.value)
    assert info.value.rank == 1
    assert info.value.exc_type == "ValueError"
    assert "a bug at batch size 8" in str(info.value)


def allocate(batch_size: int, fits: int, kind: str) -> int:
    """A real allocation failure above ``fits``: torch's allocator, or Python's MemoryError."""
    size = 2**62 if batch_size > fits else 16
    if kind == "torch":
        torch.empty(size, dtype=torch.uint8)
    else:
        bytearray(size)
    return batch_size


@pytest.mark.parametrize("kind", ["torch", "python"])
def test_outside_a_launch_it_is_accelerates_loop(kind):
    tried: list[int] = []

    def inner(batch_size: int, fits: int) -> int:
        tried.append(batch_size)
        return allocate(batch_size, fits, kind)

    assert not dist.is_initialized()
    assert find_executable_batch_size(inner, starting_batch_size=100)(50) == 45
    assert tried == [100, 90, 81, 72, 64, 57, 51, 45]
    if kind == "torch":   # Accelerate's takes the same steps (it does not count MemoryError)
        ours = tried[:]
        tried.clear()
        assert accelerate_memory.find_executable_batch_size(inner, starting_batch_size=100)(50) == 45
        assert tried == ours

    halving = find_executable_batch_size(starting_batch_size=64, reduce_batch_size_fn=lambda: 64 // 2 ** len(tried))
    tried.clear()
    assert halving(inner)(10) == 8

    with pytest.raises(TypeError, match="Remove this as the decorator already does so"):
        find_executable_batch_size(inner)(32, 10)
    with pytest.raises(RuntimeError, match="reached zero"):
        find_executable_batch_size(inner, starting_batch_size=4)(0)
