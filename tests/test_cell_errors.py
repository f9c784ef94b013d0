"""Errors point at the notebook's cells, not at notebook_launch: what a real kernel
shows for a failing rank (fork and spawn), a bad argument and ``%tb``, and what a
plain script still prints."""
import re
import subprocess
import sys
import textwrap

import pytest

from notebook_launch import LaunchError
from notebook_launch.errors.render import render_remote_traceback

ANSI = re.compile(r"\x1b\[[0-9;]*m")

TRAIN = '''def train(n):
    import os
    total = sum(range(n))
    if os.environ["RANK"] == "1":
        raise ValueError(f"boom after {total}")
    return total'''


def error_outputs(cell):
    return [out for out in cell.outputs if out.output_type == "error"]


def shown(out) -> str:
    return ANSI.sub("", "\n".join(out.traceback))


@pytest.fixture(scope="module")
def executed():
    pytest.importorskip("nbclient")
    from helpers.nbutil import make_notebook, run_notebook
    return run_notebook(make_notebook(
        "from notebook_launch import notebook_launcher",
        TRAIN,
        "notebook_launcher(train, args=(10,), num_processes=2, ui='text')",
        "%tb",
        "notebook_launcher(train, args=(10,), num_processes=2, ui='text', start_method='spawn')",
        "notebook_launcher(train, num_processes=0)",
        "import sys\nprint('LAST', type(sys.last_value).__name__, sys.last_traceback is not None)",
        "%load_ext notebook_launch",
        "%%launch -n 2 --ui text\nimport os\nif os.environ['RANK'] == '0':\n    raise KeyError('from the magic cell')",
    ), allow_errors=True)


@pytest.mark.parametrize("index", [2, 4], ids=["fork", "spawn"])
def test_failing_rank_shows_its_cell_and_no_frame_of_ours(executed, index):
    errors = error_outputs(executed.cells[index])
    assert len(errors) == 1 and errors[0].ename == "LaunchError"
    text = shown(errors[0])
    assert text.startswith("LaunchError: rank 1 failed: ValueError: boom after 45"), text
    assert "Traceback from rank 1" in text
    # the rank's frame, named as IPython names the cell, with the cell's lines
    assert "Cell In[2], line 5, in train" in text, text
    assert '--->' in text and 'raise ValueError(f"boom after {total}")' in text
    assert "total = sum(range(n))" in text     # context before the failing line
    # (the log folder may sit in ~/.cache/notebook_launch/runs: frames are files ending .py)
    assert not re.search(r"notebook_launch/[\w/]*\.py", text) and "ipykernel_" not in text, text
    assert "launcher.py" not in text and "supervisor" not in text
    # the other ranks' fates and the log folder
    assert "Other ranks:" in text and "rank 0:" in text and "Logs: " in text


def test_a_launch_cell_is_named_too(executed):
    text = shown(error_outputs(executed.cells[8])[0])
    assert "Cell In[9], line 3" in text and "raise KeyError('from the magic cell')" in text, text
    assert not re.search(r"notebook_launch/[\w/]*\.py", text), text


EARLY = '''def early(n):
    import os
    if os.environ["RANK"] == "0":
        raise RuntimeError(f"early {n * 2}")


'''   # blank lines at the end: IPython 7's history keeps the cell stripped of them

LATER = '''def later(n):
    import os
    if os.environ["RANK"] == "0":
        raise IndexError(f"later {n}")
    return n'''


@pytest.fixture(scope="module")
def executed_more():
    """Cells defined before notebook_launch is imported, persistent ranks (a function and a
    %%ranks cell), a cell run twice, on whatever IPython the tests run (7.34 in the Colab and
    Kaggle lanes: no map from cell files to numbers there, see errors.render.cell_label)."""
    pytest.importorskip("nbclient")
    from helpers.nbutil import make_notebook, run_notebook
    return run_notebook(make_notebook(
        EARLY,                                                                              # In[1]
        "from notebook_launch import notebook_launcher, start_ranks\n"
        "from notebook_launch.planning.net import free_port\n%load_ext notebook_launch",           # In[2]
        "notebook_launcher(early, args=(3,), num_processes=2, ui='text')",                  # In[3]
        "ranks = start_ranks(2, ui='text', use_port=free_port())",                          # In[4]
        LATER,                                                                              # In[5]
        "ranks.run(later, args=(7,))",                                                      # In[6]
        LATER,                                                                              # In[7]: again
        "ranks.run(later, args=(9,))",                                                      # In[8]
        "ranks.close()",                                                                    # In[9]
        "%ranks start -n 2 --ui text --port {free_port()}",                                 # In[10]
        "%%ranks\nimport os\nif os.environ['RANK'] == '1':\n    raise KeyError('from a ranks cell')",  # In[11]
        "notebook_launcher(later, args=(11,), num_processes=2, ui='text', start_method='spawn')",  # In[12]
        "%ranks stop",                                                                      # In[13]
    ), allow_errors=True)


@pytest.mark.parametrize("index, label, line, rank", [
    (2, "Cell In[1], line 4, in early", 'raise RuntimeError(f"early {n * 2}")', 0),
    (5, "Cell In[5], line 4, in later", 'raise IndexError(f"later {n}")', 0),
    (7, "Cell In[7], line 4, in later", 'raise IndexError(f"later {n}")', 0),
    (10, "Cell In[11], line 3", "raise KeyError('from a ranks cell')", 1),
    (11, "Cell In[7], line 4, in later", 'raise IndexError(f"later {n}")', 0),
], ids=["defined-before-the-import", "persistent-run", "persistent-cell-run-twice", "persistent-ranks-cell",
        "spawn-cell-run-twice"])
def test_every_kind_of_cell_is_named_with_its_lines(executed_more, index, label, line, rank):
    errors = error_outputs(executed_more.cells[index])
    assert len(errors) == 1 and errors[0].ename == "LaunchError", executed_more.cells[index].outputs
    text = shown(errors[0])
    assert f"Traceback from rank {rank}" in text, text
    assert label in text, text
    assert "---> " in text and line in text, text
    assert not re.search(r"notebook_launch/[\w/]*\.py", text) and "ipykernel_" not in text, text
    assert "<ipython-input-" not in text, text


def test_persistent_ranks_closed_cleanly(executed_more):
    assert not error_outputs(executed_more.cells[8]) and not error_outputs(executed_more.cells[12])


def test_tb_magic_shows_the_same(executed):
    assert shown(error_outputs(executed.cells[3])[0]) == shown(error_outputs(executed.cells[2])[0])


def test_argument_error_is_one_line_of_what_to_do(executed):
    errors = error_outputs(executed.cells[5])
    assert len(errors) == 1 and errors[0].ename == "LaunchArgumentError"
    assert shown(errors[0]) == ("LaunchArgumentError: num_processes must be >= 1, or None (one rank per accelerator); "
                                "got 0")


def test_debug_still_has_the_traceback(executed):
    # %debug opens sys.last_traceback: IPython still records it for our errors
    text = "".join(out.get("text", "") for out in executed.cells[6].outputs)
    assert "LAST LaunchArgumentError True" in text, text


def test_a_script_prints_the_usual_traceback_and_message(tmp_path):
    script = tmp_path / "fails.py"
    script.write_text(textwrap.dedent('''
        from notebook_launch import notebook_launcher
        ''') + TRAIN + textwrap.dedent('''

        if __name__ == "__main__":
            notebook_launcher(train, args=(10,), num_processes=2, ui="none")
        '''))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 1
    err = done.stderr
    assert "Traceback (most recent call last):" in err
    assert "notebook_launch.errors.LaunchError: rank 1 failed: ValueError: boom after 45" in err, err
    assert f'File "{script}", line 7, in train' in err   # the rank's frame, as Python names it


def test_frames_of_ours_are_left_out_and_counted():
    import os

    import notebook_launch
    ours = os.path.join(os.path.dirname(notebook_launch.__file__), "progress.py")
    remote = (
        'Traceback (most recent call last):\n'
        '  File "/home/u/train.py", line 3, in train\n'
        '    for x in progress(data):\n'
        f'  File "{ours}", line 200, in _counting_iter\n'
        '    for item in self.iterable:\n'
        '  File "/home/u/data.py", line 9, in __iter__\n'
        '    raise KeyError("k")\n'
        '    ^^^^^^^^^^^^^^^^^^^\n'
        "KeyError: 'k'\n")
    text = ANSI.sub("", "\n".join(render_remote_traceback(remote)))
    assert "File /home/u/train.py:3, in train" in text and "File /home/u/data.py:9, in __iter__" in text
    assert "for item in self.iterable" not in text and ours not in text
    assert "(1 frame of notebook_launch hidden)" in text and "KeyError: 'k'" in text
    error = LaunchError("rank 0 failed: KeyError: 'k'\n\nTraceback from rank 0:\n" + remote
                        + "\nOther ranks:\n  rank 1: finished\nLogs: /tmp/x", rank=0,
                        remote_traceback=remote, log_dir="/tmp/x")
    lines = [ANSI.sub("", line) for line in error._render_traceback_()]
    assert lines[0] == "LaunchError: rank 0 failed: KeyError: 'k'"
    assert lines[-3:] == ["Other ranks:", "  rank 1: finished", "Logs: /tmp/x"]


def test_text_around_the_traceback_is_kept_also_when_the_message_shortened_it():
    remote = 'Traceback (most recent call last):\n  File "/u/t.py", line 3, in f\n    g()\nValueError: x\n'
    noted = LaunchError("node 1, rank 3 failed: ValueError: x\n\nTraceback from rank 3 (node 1):\n"
                        + remote.rstrip() + "\n\nRanks on this node (node 0):\n  rank 0: stopped\n"
                        "Logs of this node: /tmp/a (node 1 has its own)\nAttempt 2 of 2: no restarts left.",
                        rank=3, remote_traceback=remote, log_dir="/tmp/a")
    lines = [ANSI.sub("", line) for line in noted._render_traceback_()]
    assert lines[:3] == ["LaunchError: node 1, rank 3 failed: ValueError: x", "",
                         "Traceback from rank 3 (node 1) (most recent call last):"]
    assert "File /u/t.py:3, in f" in lines
    assert lines[-5:] == ["", "Ranks on this node (node 0):", "  rank 0: stopped",
                          "Logs of this node: /tmp/a (node 1 has its own)", "Attempt 2 of 2: no restarts left."]
    shortened = LaunchError("rank 3 failed: ValueError: x\n\nTraceback from rank 3:\n  ... (cut) ...\n"
                            "ValueError: x\n\nOther ranks:\n  rank 0: finished\nLogs: /tmp/b",
                            rank=3, remote_traceback=remote, log_dir="/tmp/b")
    lines = [ANSI.sub("", line) for line in shortened._render_traceback_()]
    assert "File /u/t.py:3, in f" in lines     # the full traceback from the attribute
    assert lines[-3:] == ["Other ranks:", "  rank 0: finished", "Logs: /tmp/b"]
