"""Hugging Face Accelerate code runs unchanged inside launched CPU ranks.

Each launched function uses Accelerate exactly as its docs show; the
assertions are Accelerate's documented behaviour with 2 processes.
"""
from __future__ import annotations

import pytest
import torch

from notebook_launch import LaunchError, notebook_launcher

accelerate = pytest.importorskip("accelerate")

N = 2


def _launch(fn, *args, **kwargs):
    kwargs.setdefault("ui", "text")
    kwargs.setdefault("timeout", 240)   # a stuck rendezvous fails with the ranks named, not a silent hang
    return notebook_launcher(fn, args=args, num_processes=N, **kwargs)


# --- who am I -----------------------------------------------------------------

def _whoami():
    from accelerate import Accelerator
    from accelerate.utils import DistributedType
    acc = Accelerator()
    # Every rank past the rendezvous before any returns: rank 0 hosts the TCPStore, and its exit
    # while rank 1 is still connecting to it fails rank 1 (seen once on a loaded machine).
    acc.wait_for_everyone()
    return {
        "multi_cpu": acc.distributed_type == DistributedType.MULTI_CPU,
        "num_processes": acc.num_processes,
        "process_index": acc.process_index,
        "local_process_index": acc.local_process_index,
        "is_main_process": acc.is_main_process,
        "is_local_main_process": acc.is_local_main_process,
        "device": acc.device.type,
        "mixed_precision": acc.mixed_precision,
        "dist_world": torch.distributed.get_world_size(),
    }


def test_each_rank_sees_multi_cpu_and_the_right_world():
    results = _launch(_whoami)
    assert [r["process_index"] for r in results] == list(range(N))
    for rank, r in enumerate(results):
        assert r["multi_cpu"], r
        assert r["num_processes"] == N and r["dist_world"] == N
        assert r["local_process_index"] == rank
        assert r["is_main_process"] is (rank == 0)
        assert r["is_local_main_process"] is (rank == 0)
        assert r["device"] == "cpu"
        assert r["mixed_precision"] == "no"


def test_bf16_reaches_the_accelerator():
    """Accelerate's own notebook_launcher exports MIXED_PRECISION, which Accelerator ignores."""
    results = _launch(_whoami, mixed_precision="bf16")
    assert [r["mixed_precision"] for r in results] == ["bf16"] * N


def test_notebook_state_does_not_leak_into_ranks():
    """An Accelerator made in a rank starts clean even if the parent imported accelerate."""
    from accelerate.state import PartialState
    assert not PartialState._shared_state
    results = _launch(_whoami)
    assert sum(r["is_main_process"] for r in results) == 1
    assert not PartialState._shared_state, "the launch must not create state in the notebook"


# --- collectives ---------------------------------------------------------------

def _collectives():
    from accelerate import Accelerator
    acc = Accelerator()
    rank = acc.process_index
    gathered = acc.gather(torch.tensor([rank, rank * 10]))
    # Ragged per-rank tensors: pad to the longest along dim 0.
    ragged = torch.full((rank + 1, 2), rank + 1)
    padded = acc.pad_across_processes(ragged, dim=0, pad_index=-1)
    padded_first = acc.pad_across_processes(ragged, dim=0, pad_index=-1, pad_first=True)
    reduced = acc.reduce(torch.tensor(float(rank + 1)), reduction="sum")
    objects = accelerate.utils.gather_object([f"rank{rank}"])
    acc.wait_for_everyone()
    return {"gathered": gathered, "padded": padded, "padded_first": padded_first,
            "reduced": reduced.item(), "objects": objects}


def test_gather_pad_reduce_and_wait():
    results = _launch(_collectives)
    for r in results:
        assert r["gathered"].tolist() == [0, 0, 1, 10]
        assert r["reduced"] == 3.0
        assert r["objects"] == ["rank0", "rank1"]
    assert results[0]["padded"].tolist() == [[1, 1], [-1, -1]]
    assert results[0]["padded_first"].tolist() == [[-1, -1], [1, 1]]
    assert results[1]["padded"].tolist() == [[2, 2], [2, 2]]


def _gather_for_metrics(n_items, batch_size):
    from accelerate import Accelerator
    from torch.utils.data import DataLoader, TensorDataset
    acc = Accelerator()
    loader = acc.prepare(DataLoader(TensorDataset(torch.arange(n_items)), batch_size=batch_size))
    seen, plain = [], []
    for (batch,) in loader:
        plain.append(acc.gather(batch))
        seen.append(acc.gather_for_metrics(batch))
    return {"batches": len(loader), "metrics": torch.cat(seen).tolist(),
            "plain_len": int(sum(len(t) for t in plain))}


def test_gather_for_metrics_drops_the_duplicates_of_the_last_batch():
    # 10 items, batch 4 per rank, 2 ranks: 2 global batches of 8, the last one padded
    # with repeats; gather returns 16 items, gather_for_metrics exactly the 10.
    results = _launch(_gather_for_metrics, 10, 4)
    for r in results:
        assert r["batches"] == 2
        assert r["plain_len"] == 16
        assert sorted(r["metrics"]) == list(range(10))


# --- training ------------------------------------------------------------------

def _train(steps_per_epoch=8, epochs=3, accumulation=1, save_dir=None):
    from accelerate import Accelerator
    from torch.utils.data import DataLoader, TensorDataset

    acc = Accelerator(gradient_accumulation_steps=accumulation)
    torch.manual_seed(0)
    x = torch.randn(steps_per_epoch * 8 * acc.num_processes, 4)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.25
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.95)
    loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)
    model, optimizer, loader, scheduler = acc.prepare(model, optimizer, loader, scheduler)

    first_loss = last_loss = None
    syncs, norms, updates = [], [], 0
    before = [p.detach().clone() for p in model.parameters()]
    for _ in range(epochs):
        for xb, yb in loader:
            with acc.accumulate(model):
                loss = torch.nn.functional.mse_loss(model(xb), yb)
                acc.backward(loss)
                syncs.append(acc.sync_gradients)
                if acc.sync_gradients:
                    norms.append(float(acc.clip_grad_norm_(model.parameters(), 5.0)))
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            after = [p.detach() for p in model.parameters()]
            if any(not torch.equal(a, b) for a, b in zip(before, after)):
                updates += 1
                before = [p.clone() for p in after]
            loss_all = acc.gather(loss.detach()).mean().item()
            first_loss = loss_all if first_loss is None else first_loss
            last_loss = loss_all
    acc.wait_for_everyone()
    unwrapped = acc.unwrap_model(model)
    if save_dir is not None:
        acc.save(unwrapped.state_dict(), f"{save_dir}/model.pt")
    acc.print(f"accelerate-print from process {acc.process_index}")
    print(f"plain-print from process {acc.process_index}")
    return {
        "wrapped": type(model).__name__,
        "unwrapped": type(unwrapped).__name__,
        "state": unwrapped.state_dict(),
        "first_loss": first_loss, "last_loss": last_loss,
        "batches_per_epoch": len(loader), "syncs": syncs, "norms": norms, "updates": updates,
        "lr": scheduler.get_last_lr()[0],
    }


def test_training_ends_with_the_same_weights_on_every_rank(tmp_path, capsys):
    results = _launch(_train, 8, 3, 1, str(tmp_path), log_dir=str(tmp_path / "logs"))
    r0, r1 = results
    assert r0["wrapped"] == "DistributedDataParallel"
    assert r0["unwrapped"] == "Sequential"
    assert r0["batches_per_epoch"] == 8          # 128 samples / batch 8 / 2 ranks
    for key in r0["state"]:
        assert torch.equal(r0["state"][key], r1["state"][key]), key
    assert r0["last_loss"] < r0["first_loss"] / 2
    assert r0["updates"] == 24 and all(r0["syncs"])
    assert all(n >= 0 for n in r0["norms"]) and len(r0["norms"]) == 24
    # the prepared scheduler steps once per process count per optimizer step (Accelerate's rule)
    assert r0["lr"] == pytest.approx(0.1 * 0.95 ** (24 * N // 4))
    # save writes once, from the main process, what unwrap_model returned
    saved = torch.load(tmp_path / "model.pt")
    assert set(saved) == set(r0["state"])
    for key in saved:
        assert torch.equal(saved[key], r0["state"][key])
    # Accelerator.print prints on the main process only; print on every rank
    out = capsys.readouterr().out
    assert "accelerate-print from process 0" in out
    assert "accelerate-print from process 1" not in out
    assert "plain-print from process 0" in out and "plain-print from process 1" in out
    rank1_log = (tmp_path / "logs" / "rank1.log").read_text()
    assert "plain-print from process 1" in rank1_log and "accelerate-print" not in rank1_log


def test_gradient_accumulation_steps_only_every_nth_batch():
    results = _launch(_train, 8, 1, 4)
    for r in results:
        assert r["syncs"] == [False, False, False, True] * 2
        assert r["updates"] == 2                  # 8 batches / 4 accumulation steps
        assert len(r["norms"]) == 2
    for key in results[0]["state"]:
        assert torch.equal(results[0]["state"][key], results[1]["state"][key])


def _fails_on_rank_1():
    from accelerate import Accelerator
    acc = Accelerator()
    if acc.process_index == 1:
        raise ValueError("bad batch on rank 1")
    acc.wait_for_everyone()


def test_a_failing_rank_raises_launch_error_with_its_traceback():
    with pytest.raises(LaunchError) as info:
        _launch(_fails_on_rank_1, timeout=120)
    assert info.value.rank == 1
    assert "ValueError: bad batch on rank 1" in str(info.value)
    assert info.value.remote_traceback is not None
    assert "_fails_on_rank_1" in info.value.remote_traceback
