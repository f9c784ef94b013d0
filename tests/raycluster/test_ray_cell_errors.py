"""The Ray backend's errors point at the notebook's cells as the other backends' do: a rank on
the second node fails in a function defined in a cell, and the notebook (a real kernel on
node A, run by nbclient) shows ``Cell In[2], line L, in train`` with the cell's lines, no
frame of notebook_launch and no ipykernel file name. The kernel runs this interpreter, so the
IPython 7.34 lanes check IPython 7's cell naming (render.cell_label) here too.
"""
from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.timeout(600)

ANSI = re.compile(r"\x1b\[[0-9;]*m")

SETUP = """
import os
from notebook_launch import notebook_launcher, RayCluster
HEAD = {head!r}
"""

TRAIN = """def train():
    import time
    node, local = os.environ["NODE_RANK"], os.environ["LOCAL_RANK"]
    if node == "1" and local == "1":
        raise ValueError(f"boom on node {node}")
    time.sleep(600)"""


def test_a_ray_rank_error_names_the_cell_and_shows_its_lines(ray_nodes, node_a_kernel):
    import nbclient
    import nbformat
    from helpers.nbutil import stop_kernel
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(SETUP.format(head=ray_nodes.head)), nbformat.v4.new_code_cell(TRAIN),
                nbformat.v4.new_code_cell("notebook_launcher(train, num_processes=4, ui='text', "
                                          "cluster=RayCluster(address=HEAD, placement='SPREAD'))")]
    client = nbclient.NotebookClient(nb, km=node_a_kernel, timeout=300, allow_errors=True)
    try:
        client.execute(env=ray_nodes.env, cwd=str(ray_nodes.tmp))
    finally:
        stop_kernel(client, node_a_kernel)
    errors = [o for o in nb.cells[2].outputs if o.output_type == "error"]
    assert len(errors) == 1 and errors[0].ename == "LaunchError", nb.cells[2].outputs
    text = ANSI.sub("", "\n".join(errors[0].traceback))
    assert re.match(r"LaunchError: node 1 \([\d.]+\), rank 3 failed: ValueError: boom on node 1", text), text
    assert "Cell In[2], line 5, in train" in text, text
    assert '---> 5' in text and 'raise ValueError(f"boom on node {node}")' in text, text
    assert 'if node == "1" and local == "1":' in text                # the line before it
    assert not re.search(r"notebook_launch/[\w/]*\.py", text) and "ipykernel_" not in text, text
