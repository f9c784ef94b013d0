"""What a rank starts only when it is used (issue 45): torch.distributed's collectives wrapped when
the first default group comes into being, and tqdm patched when the rank makes its first bar. A
trivial launch then pays for neither; these tests check that nothing the user sees is lost: a
hang's verdict still names the collective each rank waits in, however the group was made, and
every bar still reaches the panel, whenever tqdm was imported."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from helpers.panel_helpers import KeepStateDisplay

from notebook_launch import LaunchError, notebook_launcher
from notebook_launch.planning.net import free_port

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
# A reference taken before the launch, as a library imported in the notebook takes it: calling it
# bypasses torch.distributed's attribute, which the rank wraps.
from torch.distributed.distributed_c10d import init_process_group as init_taken_before  # noqa: E402

HANG = 600


def joins_by_an_old_reference_then_rank_1_sleeps():
    init_taken_before("gloo")
    t = torch.ones(3)
    dist.all_reduce(t)
    if int(os.environ["RANK"]) == 1:
        time.sleep(HANG)
    dist.all_reduce(t)


def test_a_hang_verdict_names_the_collective_of_a_group_made_through_an_old_reference(log_dir):
    with pytest.raises(LaunchError) as info:
        notebook_launcher(joins_by_an_old_reference_then_rank_1_sleeps, num_processes=2, timeout=12,
                          log_dir=log_dir, ui="text", use_port=str(free_port()))
    error = info.value
    assert error.kind == "timeout"
    first = str(error).splitlines()[0]
    assert "rank 0 waits in all_reduce #2" in first, str(error)
    assert "rank 1 never reached it" in first, str(error)
    assert "tensors (3,) float32" in str(error)


def wrapped_before_and_after_joining():
    """Whether all_reduce is recorded before the group exists, and after (in the rank)."""
    before = getattr(dist.all_reduce, "_notebook_launch_wrapped", False)
    init_taken_before("gloo")
    after = getattr(dist.all_reduce, "_notebook_launch_wrapped", False) and \
        getattr(dist.distributed_c10d.all_reduce, "_notebook_launch_wrapped", False)
    joined = getattr(dist.init_process_group, "_notebook_launch_wrapped", False)
    dist.destroy_process_group()
    return before, after, joined


def test_collectives_are_wrapped_once_the_first_group_comes_into_being():
    results = notebook_launcher(wrapped_before_and_after_joining, num_processes=2, ui="text",
                                use_port=str(free_port()))
    assert results == [(False, True, True)] * 2


def draws_a_bar_made_in_the_notebook(bar):
    for _ in range(5):
        bar.update(1)
    print("bar done", file=sys.stderr)
    return True


def test_a_bar_made_in_the_notebook_before_the_launch_writes_nothing_in_a_rank():
    """Such a bar has no ``__new__`` left to run in the rank: tqdm is patched at the rank's start.
    The bar writes to fd 2 (``sys.__stderr__``), which in a rank is its stderr pipe: a bar's text
    written to pytest's ``sys.stderr`` in a rank did not reach the display, and the test passed
    with the patch left out."""
    tqdm = pytest.importorskip("tqdm").tqdm
    bar = tqdm(total=5, file=sys.__stderr__, mininterval=0)
    try:
        display = KeepStateDisplay()
        assert notebook_launcher(draws_a_bar_made_in_the_notebook, args=(bar,), num_processes=2,
                                 ui=display) == [True, True]
    finally:
        bar.close()
    texts = [text for _, _, text in display.lines]
    assert texts.count("bar done") == 2
    assert not [t for t in texts if "it/s" in t or "%|" in t], texts


TQDM_AFTER_THE_START = """
import sys
import notebook_launch
assert "tqdm" not in sys.modules
from helpers.panel_helpers import KeepStateDisplay

def draws():
    from tqdm.auto import tqdm
    for _ in tqdm(range(30), desc="late", mininterval=0):
        pass
    return True

if __name__ == "__main__":
    display = KeepStateDisplay()
    assert notebook_launch.notebook_launcher(draws, num_processes=2, ui=display) == [True, True]
    for rs in display.state.ranks:
        bars = {bar.desc: bar for bar in rs.bars.values()}
        assert (bars["late"].n, bars["late"].total, bars["late"].closed) == (30, 30, True), bars
    texts = [text for _, _, text in display.lines]
    assert not [t for t in texts if "it/s" in t or "%|" in t], texts
    print("ok")
"""


def test_a_bar_from_tqdm_imported_only_after_the_rank_started_reaches_the_panel(tmp_path):
    """A notebook that never imported tqdm (nor torch): the rank patches it when it imports it."""
    pytest.importorskip("tqdm")
    script = tmp_path / "late_tqdm.py"
    script.write_text(TQDM_AFTER_THE_START)
    tests = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [tests, os.path.dirname(tests), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stdout + out.stderr


def draws_a_bar():
    from tqdm.auto import tqdm
    for _ in tqdm(range(20), desc="in the rank", mininterval=0):
        pass
    return True


def test_the_first_bar_hook_is_put_on_in_the_notebook_and_does_nothing_there():
    """The first-bar hook is put on tqdm in the notebook before the forks (issue 45: set in every
    rank it cost each a third of a millisecond) and acts in the ranks only: their bars reach the
    panel, while a bar the notebook makes after the launch is tqdm's own, unpatched, writing its
    text where it was told, and the hook stays as it was (put on once, never taken off there)."""
    tqdm_std = pytest.importorskip("tqdm.std")
    import io

    from notebook_launch.rank.integrations import tqdm_bridge
    display = KeepStateDisplay()
    assert notebook_launcher(draws_a_bar, num_processes=2, ui=display) == [True, True]
    for rs in display.state.ranks:
        bars = {bar.desc: bar for bar in rs.bars.values()}
        assert (bars["in the rank"].n, bars["in the rank"].closed) == (20, True), bars
    hook = tqdm_std.tqdm.__dict__["__new__"]
    assert getattr(hook.__func__, "_notebook_launch_first_bar", False) and not tqdm_bridge._active
    text = io.StringIO()
    for _ in tqdm_std.tqdm(range(7), file=text, mininterval=0, ascii=True):
        pass
    assert "7/7" in text.getvalue() and not hasattr(tqdm_std.tqdm, "_panel_sync"), text.getvalue()
    assert tqdm_std.tqdm.__dict__["__new__"] is hook
    assert notebook_launcher(draws_a_bar, num_processes=1, ui=KeepStateDisplay()) == [True]
    assert tqdm_std.tqdm.__dict__["__new__"] is hook
