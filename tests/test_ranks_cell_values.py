"""A %%ranks cell's value per rank, and a cell on some ranks only, in a real Jupyter kernel
(nbclient), on real forked ranks with gloo."""
import pytest
from helpers.nbutil import cell_text, make_notebook, run_notebook

pytestmark = pytest.mark.timeout(300)


def shown(cell):
    """The display entries a cell showed (text/plain, and whether it had html), in order."""
    return [(o["data"].get("text/plain", ""), "text/html" in o["data"])
            for o in cell.outputs if o.output_type in ("display_data", "execute_result")]


def test_a_cells_last_expression_shows_each_ranks_value_and_a_subset_runs_alone(tmp_path):
    nb = make_notebook(
        "%load_ext notebook_launch",
        "from notebook_launch.planning.net import free_port\n%ranks start -n 3 --ui text --port {free_port()}",
        "%%ranks\nimport os\nrank = int(os.environ['RANK'])\nrank * 10",                    # 2: a value per rank
        "%%ranks\nrank * 10;",                                                                # 3: ; hides it
        "%%ranks\nNone if rank == 1 else {'rank': rank, 'lines': list(range(30))}",        # 4: None shows nothing
        "%%ranks --ranks 0,2\nmarked = rank\nrank + 100",                                    # 5: a subset
        "%ranks pull marked",                                                                 # 6: rank 1 ran nothing
        "%%ranks --ranks 0\nrank + 1000",                                                     # 7: only rank 0
        "%%ranks\nimport threading\nthreading.Lock()",                                       # 8: does not pickle
        "class Rich:\n    def _repr_html_(self):\n        return '<b>rich</b>'\n    def __repr__(self):\n"
        "        return 'Rich()'",
        "%%ranks --ranks 1\nRich()",                                                          # 10: HTML with its tag
        "%%ranks --ranks 0,7\n1",                                                             # 11: bad rank
        "%%ranks --ranks x\n1",                                                               # 12: bad option
        "%ranks stop",
    )
    run_notebook(nb, cwd=str(tmp_path), allow_errors=True)
    cells = nb.cells
    assert shown(cells[2]) == [("[rank 0] 0", False), ("[rank 1] 10", False), ("[rank 2] 20", False)]
    assert not any(o.output_type == "execute_result" for o in cells[2].outputs)   # no Out[] list besides
    assert shown(cells[3]) == []
    entries = shown(cells[4])
    assert [text.split("\n")[0] for text, _ in entries] == ["[rank 0]", "[rank 2]"]   # long: tag on its own line
    assert "'rank': 2" in entries[1][0]
    assert shown(cells[5]) == [("[rank 0] 100", False), ("[rank 2] 102", False)]
    assert "runs on ranks 0, 2 only; rank 1 runs nothing and waits" in cell_text(cells[5])
    error = [o for o in cells[6].outputs if o.output_type == "error"]
    assert error and "'marked' not defined in this rank's namespace" in error[0].evalue   # rank 1 did not run it
    assert shown(cells[7]) == [("[rank 0] 1000", False)]
    texts = [text for text, _ in shown(cells[8])]
    assert len(texts) == 3 and all(text.startswith(f"[rank {r}] <unlocked _thread.lock object at")
                                   for r, text in enumerate(texts))
    assert not [o for o in cells[8].outputs if o.output_type == "error"]
    assert shown(cells[10]) == [("[rank 1]", True), ("Rich()", True)]
    bad = [o for o in cells[11].outputs if o.output_type == "error"][0]
    assert bad.ename == "LaunchArgumentError" and "between 0 and 2" in bad.evalue and "7" in bad.evalue
    bad = [o for o in cells[12].outputs if o.output_type == "error"][0]
    assert "--ranks takes global ranks separated by commas" in bad.evalue
