"""What only a GPU can show: fork after torch was imported, one device per rank, NCCL,
mixed precision through Accelerate, CUDA results, and the CUDA guards in a real kernel.

Skipped (with the reason) where no CUDA device is visible: see conftest.py. Run with
``bash scripts/test-gpu.sh`` on a GPU machine.
"""
from __future__ import annotations

import os
import textwrap

import pytest

from gpu_lane import cuda_backend_of, cuda_devices, needs_kernel

from notebook_launch import notebook_launcher


def device_of_each_rank():
    import torch
    return {"local_rank": int(os.environ["LOCAL_RANK"]), "current": torch.cuda.current_device(),
            "bad_fork": torch.cuda._is_in_bad_fork(), "sum": torch.ones(4, device="cuda").sum().item()}


def test_fork_after_torch_import_gives_each_rank_its_own_device(gpus, log_dir):
    import torch
    assert not torch.cuda.is_initialized(), "the test process must not hold CUDA (it forks the ranks)"
    results = notebook_launcher(device_of_each_rank, num_processes=gpus, log_dir=log_dir)
    assert [r["local_rank"] for r in results] == list(range(gpus))
    assert all(r["current"] == r["local_rank"] for r in results), results
    assert not any(r["bad_fork"] for r in results), "a forked rank inherited a CUDA context"
    assert all(r["sum"] == 4.0 for r in results)
    assert not torch.cuda.is_initialized(), "launching must not initialize CUDA in the notebook"


def nccl_all_reduce():
    import torch
    import torch.distributed as dist
    dist.init_process_group()     # no backend: the launcher's environment, torch picks per device
    # torch 2.6+: get_backend() is "undefined" here (init_process_group() without a backend lets
    # BackendConfig map the accelerator's device type to its default, cuda -> nccl), so what
    # says "CUDA tensors go through NCCL" is the config (see tests/test_gpu_lane_checks.py).
    config = dist.get_backend_config()
    value = torch.tensor([float(dist.get_rank() + 1)], device="cuda")
    dist.all_reduce(value)
    dist.destroy_process_group()
    return {"cuda_backend": cuda_backend_of(config), "sum": value.item()}


def test_nccl_all_reduce_over_every_gpu(gpus, log_dir):
    results = notebook_launcher(nccl_all_reduce, num_processes=gpus, log_dir=log_dir)
    expected = gpus * (gpus + 1) / 2
    assert results == [{"cuda_backend": "nccl", "sum": expected}] * gpus


def accelerate_step(dtype_name):
    import torch
    from accelerate import Accelerator
    accelerator = Accelerator()
    layer = torch.nn.Linear(8, 8)
    model = torch.nn.Sequential(layer)
    computed = []   # the dtype the layer computed in: a prepared model's output is cast back to
    # float32 (Accelerate's convert_outputs_to_fp32, also what a hook on the model itself sees),
    # so only inside it does the precision show
    layer.register_forward_hook(lambda module, args, out: computed.append(out.dtype))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = accelerator.prepare(model, opt)
    x = torch.randn(16, 8, device=accelerator.device)
    out = model(x)
    loss = out.float().pow(2).mean()
    accelerator.backward(loss)
    opt.step()
    return {"mixed_precision": str(accelerator.mixed_precision), "dtype": str(computed[0]),
            "device": str(accelerator.device), "world": accelerator.num_processes,
            "finite": bool(torch.isfinite(loss).item())}


@pytest.mark.parametrize("precision,dtype", [("bf16", "torch.bfloat16"), ("fp16", "torch.float16")])
def test_mixed_precision_reaches_accelerator(gpus, log_dir, precision, dtype):
    results = notebook_launcher(accelerate_step, args=(precision,), num_processes=gpus,
                                mixed_precision=precision, log_dir=log_dir)
    for local_rank, r in enumerate(results):
        assert r["mixed_precision"] == precision and r["dtype"] == dtype, r
        assert r["device"] == f"cuda:{local_rank}" and r["world"] == gpus and r["finite"], r


def cuda_tensors():
    import torch
    rank = int(os.environ["RANK"])
    return {"t": torch.full((3,), float(rank), device="cuda"), "nested": [torch.ones(2, device="cuda")]}


def test_a_cuda_tensor_returned_comes_back_on_the_cpu(gpus, log_dir):
    import torch
    results = notebook_launcher(cuda_tensors, num_processes=gpus, log_dir=log_dir)
    for rank, r in enumerate(results):
        assert r["t"].device.type == "cpu" and r["t"].tolist() == [float(rank)] * 3
        assert r["nested"][0].device.type == "cpu"
    assert not torch.cuda.is_initialized(), "unpickling the results must not initialize CUDA here"


# --- in a real Jupyter kernel (the notebook is the kernel, so it may touch CUDA) ----------

def _run_cells(tmp_path, *cells: str, allow_errors: bool = False) -> str:
    needs_kernel()
    from helpers.nbutil import cell_text, make_notebook, run_notebook
    nb = make_notebook(*(textwrap.dedent(c) for c in cells))
    executed = run_notebook(nb, cwd=str(tmp_path), timeout=600, allow_errors=allow_errors)
    return "\n".join(cell_text(c) for c in executed.cells)


def test_cuda_guard_names_the_line_that_initialized_cuda_in_a_kernel(tmp_path):
    text = _run_cells(tmp_path, """
        %load_ext notebook_launch
        import torch
        from notebook_launch import notebook_launcher, GuardError
        """, """
        x = torch.ones(2).cuda()   # the notebook touches CUDA
        """, """
        def f():
            return 1
        try:
            notebook_launcher(f, num_processes=1, start_method="fork")   # asked for fork: refused
        except GuardError as err:
            print("GUARD:", err)
        else:
            print("NO GUARD")
        """)
    assert "GUARD: CUDA is already initialized in this notebook" in text, text
    assert "x = torch.ones(2).cuda()" in text, "the guard must quote the line that initialized CUDA"


def test_cuda_guard_without_the_hooks_refuses_and_says_the_line_is_unknown(tmp_path):
    """A bare import installs nothing (issue 21 item 6): CUDA touched before the first launch is
    still refused, and the error says how to have the line named."""
    text = _run_cells(tmp_path, """
        import torch
        from notebook_launch import notebook_launcher, GuardError
        """, """
        x = torch.ones(2).cuda()
        """, """
        def f():
            return 1
        try:
            notebook_launcher(f, num_processes=1, start_method="fork")   # asked for fork: refused
        except GuardError as err:
            print("GUARD:", err)
        else:
            print("NO GUARD")
        """)
    assert "GUARD: CUDA is already initialized in this notebook" in text, text
    assert "is unknown: it happened before notebook_launch began recording" in text, text


def test_spawn_after_cuda_was_initialized_in_the_notebook(tmp_path):
    gpus = cuda_devices()
    text = _run_cells(tmp_path, """
        import torch
        from notebook_launch import notebook_launcher
        y = torch.ones(2).cuda() * 2          # CUDA is initialized in the notebook
        """, f"""
        def f(scale):
            import os, torch
            t = torch.ones(2, device="cuda") * scale
            return {{"rank": int(os.environ["RANK"]), "current": torch.cuda.current_device(),
                     "sum": t.sum().item(), "t": t}}
        results = notebook_launcher(f, args=(3,), num_processes={gpus}, start_method="spawn")
        print("RESULTS", [(r["rank"], r["current"], r["sum"], r["t"].device.type) for r in results])
        """)
    expected = [(rank, rank, 6.0, "cpu") for rank in range(gpus)]
    assert f"RESULTS {expected}" in text, text


def test_a_notebook_holding_cuda_launches_from_the_start_process_each_rank_on_its_gpu(tmp_path):
    """Issue 41: CUDA initialized in the notebook no longer refuses a launch that did not ask for fork:
    the ranks are forked from the warm start process, which never initialized CUDA, each on its own
    GPU; a CUDA tensor passed to them is refused before anything starts, naming it."""
    gpus = cuda_devices()
    text = _run_cells(tmp_path, """
        %load_ext notebook_launch
        import torch
        from notebook_launch import notebook_launcher, LaunchArgumentError
        from notebook_launch.engines.local import start_process
        y = torch.ones(2).cuda() * 2          # CUDA is initialized in the notebook
        """, f"""
        def f():
            import os, torch
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
            return torch.cuda.current_device(), (torch.ones(2, device="cuda") * 3).sum().item()
        print("RESULTS", notebook_launcher(f, num_processes={gpus}))
        print("START PROCESS CUDA", start_process.running().state()["cuda_initialized"])
        """, """
        def g(t):
            return t.sum().item()
        try:
            notebook_launcher(g, args=(y,), num_processes=1)
        except LaunchArgumentError as err:
            print("REFUSED:", err)
        """)
    assert f"RESULTS {[(rank, 6.0) for rank in range(gpus)]}" in text, text
    assert "CUDA is initialized in this notebook: ranks start from the warm start process" in text, text
    assert "START PROCESS CUDA False" in text, text
    assert "REFUSED: args[0] is a tensor on cuda:0" in text, text


def test_persistent_ranks_after_cuda_in_the_notebook_keep_their_gpu_state(tmp_path):
    """Persistent ranks started after the notebook initialized CUDA (from the warm start process):
    a CUDA tensor one call built is still on its rank's GPU in the next call and reaches the notebook
    by ``pull`` on the CPU; ``%%ranks`` runs on the same ranks; the notebook's CUDA is untouched."""
    gpus = cuda_devices()
    text = _run_cells(tmp_path, """
        %load_ext notebook_launch
        import torch
        from notebook_launch import start_ranks
        y = torch.ones(2).cuda() * 2          # CUDA is initialized in the notebook
        """, f"""
        ranks = start_ranks({gpus}, ui="none")
        def build():
            global kept
            import os, torch
            kept = torch.full((2,), float(os.environ["LOCAL_RANK"]) + 1, device="cuda")
            return torch.cuda.current_device()
        def use():
            return kept.sum().item(), str(kept.device)
        print("BUILT", ranks.run(build))
        print("USED", ranks.run(use))
        print("PULLED", [(t.device.type, t.tolist()) for t in ranks.pull("kept")])
        """, """
        %%ranks
        kept = kept * 10
        """, """
        print("AFTER CELL", ranks.run(use))
        ranks.close()
        print("NOTEBOOK", y.device, y.sum().item())
        """)
    assert f"BUILT {list(range(gpus))}" in text, text
    assert f"USED {[(2.0 * (r + 1), f'cuda:{r}') for r in range(gpus)]}" in text, text
    assert f"PULLED {[('cpu', [float(r + 1)] * 2) for r in range(gpus)]}" in text, text
    assert f"AFTER CELL {[(20.0 * (r + 1), f'cuda:{r}') for r in range(gpus)]}" in text, text
    assert "NOTEBOOK cuda:0 4.0" in text, text


def test_kaggle_2xT4_notebook_end_to_end(tmp_path):
    gpus = cuda_devices()
    if gpus < 2:
        pytest.skip(f"the Kaggle notebook trains on 2 GPUs; {gpus} visible here")
    needs_kernel()
    import nbformat
    from helpers.nbutil import cell_text, run_notebook
    from pathlib import Path
    path = Path(__file__).resolve().parents[2] / "notebooks" / "kaggle_2xT4.ipynb"
    nb = nbformat.read(str(path), as_version=4)
    nb.cells = [c for c in nb.cells if "install" not in c.metadata.get("tags", [])]
    executed = run_notebook(nb, cwd=str(tmp_path), timeout=900)
    text = "\n".join(cell_text(c) for c in executed.cells if c.cell_type == "code")
    assert "Traceback" not in text, text
    assert f"launching {gpus} ranks" in text
    assert "CUDA GPU, nccl, fork" in text
    assert "OK: every rank returned, weights identical" in text
    assert "'mixed_precision': 'fp16'" in text


def test_is_available_in_a_kernel_is_refused_then_spawn_launches(tmp_path):
    """torch.cuda.is_available() poisons fork without initializing CUDA: the launch is refused
    naming the cell (not every rank dying in set_device), and spawn launches from there."""
    gpus = cuda_devices()
    text = _run_cells(tmp_path, """
        import os
        os.environ.pop("PYTORCH_NVML_BASED_CUDA_CHECK", None)
        %load_ext notebook_launch
        import torch
        from notebook_launch import notebook_launcher, GuardError
        """, """
        device = "cuda" if torch.cuda.is_available() else "cpu"
        print("INITIALIZED", torch.cuda.is_initialized())
        """, f"""
        def f():
            import torch
            return torch.ones(2, device="cuda").sum().item()
        try:
            notebook_launcher(f, num_processes={gpus}, start_method="fork")
        except GuardError as err:
            print("GUARD:", err)
        print("SPAWN", notebook_launcher(f, num_processes={gpus}, start_method="spawn"))
        print("UNSET", notebook_launcher(f, num_processes={gpus}))   # from the warm start process, unasked
        """)
    assert "INITIALIZED False" in text, text
    assert "GUARD: The CUDA runtime was already used in this notebook" in text, text
    assert 'device = "cuda" if torch.cuda.is_available() else "cpu"' in text, text
    assert f"SPAWN {[2.0] * gpus}" in text, text
    assert f"UNSET {[2.0] * gpus}" in text, text
    assert "the CUDA runtime was already used in this notebook: ranks start from the warm start process" in text


def test_with_the_nvml_check_is_available_leaves_fork_usable(tmp_path):
    gpus = cuda_devices()
    text = _run_cells(tmp_path, """
        import os
        os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
        import torch
        from notebook_launch import notebook_launcher
        print("AVAILABLE", torch.cuda.is_available())
        """, f"""
        def f():
            import torch
            return torch.ones(2, device="cuda").sum().item()
        print("FORK", notebook_launcher(f, num_processes={gpus}))
        """)
    assert "AVAILABLE True" in text and f"FORK {[2.0] * gpus}" in text, text
