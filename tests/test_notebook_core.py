"""The core behaviours inside a real Jupyter kernel, driven by nbclient."""
from helpers.nbutil import cell_text, make_notebook, run_notebook

SETUP = """
import os, time
from notebook_launch import notebook_launcher, LaunchError

def train(scale):
    rank = int(os.environ["RANK"])
    print(f"hello from rank {rank}")
    return rank * scale
"""


def test_results_and_rank_tagged_output_in_the_cell(tmp_path):
    nb = make_notebook(SETUP, "results = notebook_launcher(train, args=(10,), num_processes=2, ui='text')\nresults")
    run_notebook(nb, cwd=str(tmp_path))
    text = cell_text(nb.cells[1])
    assert "[rank 0] hello from rank 0" in text
    assert "[rank 1] hello from rank 1" in text
    assert "notebook_launch: 2 ranks on notebook (CPU, gloo, fork)" in text
    assert nb.cells[1].outputs[-1]["data"]["text/plain"] == "[0, 10]"


def test_failing_rank_raises_launch_error_in_the_cell(tmp_path):
    nb = make_notebook(SETUP, """
def fails():
    if os.environ["RANK"] == "1":
        raise ZeroDivisionError("loss is nan")
    time.sleep(60)
notebook_launcher(fails, num_processes=2, ui='text')
""", "after = notebook_launcher(train, args=(1,), num_processes=2, ui='text'); after")
    run_notebook(nb, cwd=str(tmp_path), allow_errors=True)
    error = [o for o in nb.cells[1].outputs if o.output_type == "error"]
    assert error and error[0].ename == "LaunchError"
    assert error[0].evalue.startswith("rank 1 failed: ZeroDivisionError: loss is nan")
    assert "raise ZeroDivisionError" in error[0].evalue
    # The kernel is still usable: a later launch in the same kernel works.
    assert nb.cells[2].outputs[-1]["data"]["text/plain"] == "[0, 1]"


def test_cuda_first_initialized_cell_is_recorded_by_the_ipython_hook(tmp_path):
    """The post-run-cell hook names the cell after which CUDA became initialized. No GPU exists
    here, so a fake stands in for torch.cuda.is_initialized (named as such in the cell)."""
    nb = make_notebook(SETUP, """
%load_ext notebook_launch
import notebook_launch.notebook.cuda_tracking as tracking
import torch   # a CUDA context needs torch imported (importing notebook_launch imports no torch)
FAKE_CUDA_CONTEXT = [False]   # stands in for a real CUDA context (no GPU here)
tracking.is_cuda_initialized = lambda: FAKE_CUDA_CONTEXT[0]
""", """
weights = [1.0, 2.0]
FAKE_CUDA_CONTEXT[0] = True   # what model.cuda() would do
""", "notebook_launcher(train, args=(1,), num_processes=2, ui='text', start_method='fork')")
    run_notebook(nb, cwd=str(tmp_path), allow_errors=True)
    error = [o for o in nb.cells[3].outputs if o.output_type == "error"][0]
    assert error.ename == "GuardError"
    assert "CUDA was already initialized after running cell [3]" in error.evalue
    assert "FAKE_CUDA_CONTEXT[0] = True   # what model.cuda() would do" in error.evalue
