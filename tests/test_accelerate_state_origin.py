"""An Accelerate state made in the notebook before a launch (issue 25 item 7): the guard names
what made it and where (``TrainingArguments`` at ``Cell In[2], line 2``), for every maker
(Accelerator(), PartialState(), AcceleratorState(), TrainingArguments); state made by
TrainingArguments alone, with no device touched, is undone for the user and the launch goes on,
each rank computing its own device. Real kernels, real Accelerate and Transformers (no downloads)."""
from __future__ import annotations

from helpers.nbutil import cell_text, make_notebook, run_notebook

from notebook_launch.notebook.accelerate_state import find_origin, makers_in_cells

LAUNCH = ("from notebook_launch import notebook_launcher, GuardError\n"
          "def where_am_i():\n"
          "    device = str(args.device)   # what Trainer(args=args) does first\n"
          "    return args.process_index, args.world_size, device\n")
TRY_LAUNCH = ("try:\n"
              "    notebook_launcher(lambda: 1, num_processes=2, ui='none')\n"
              "except GuardError as error:\n"
              "    print('REFUSED:', error)\n")
RESET = ("from accelerate.state import AcceleratorState\n"
         "AcceleratorState._reset_state(True)\n")


def test_training_arguments_made_in_a_cell_are_reset_for_the_user_and_each_rank_sets_up_its_own(tmp_path):
    nb = run_notebook(make_notebook(
        "import os\nfrom transformers import TrainingArguments",
        f"output_dir = {str(tmp_path)!r}\nargs = TrainingArguments(output_dir=output_dir, report_to=[])\n"
        "print(args.world_size, args.distributed_state is not None)",
        LAUNCH + "print(notebook_launcher(where_am_i, num_processes=2, ui='none'))",
    ), timeout=600)
    assert cell_text(nb.cells[1]).strip() == "1 True"   # the cell made a PartialState
    launched = cell_text(nb.cells[2])
    assert "reset the Accelerate state that TrainingArguments made" in launched
    assert "TrainingArguments at Cell In[2], line 2: args = TrainingArguments(" in launched
    assert "held by `args` (TrainingArguments)" in launched
    assert "[(0, 2, 'cpu:0'), (1, 2, 'cpu:0')]" in launched   # MULTI_CPU: each rank its own state


def test_every_maker_is_named_with_its_cell_and_line():
    nb = run_notebook(make_notebook(
        "from accelerate import Accelerator\nfrom accelerate.state import PartialState, AcceleratorState\n"
        "from accelerate.utils import TorchDynamoPlugin\nimport os\nos.environ['ACCELERATE_USE_CPU'] = 'true'\n"
        "from notebook_launch import notebook_launcher, GuardError",
        "import torch\naccelerator = Accelerator()",                                         # In[2]
        TRY_LAUNCH,
        RESET + "del accelerator",
        "x = 1\nprint(PartialState().process_index)",                                        # In[5]
        TRY_LAUNCH,
        RESET,
        "state = AcceleratorState(_from_accelerator=True, dynamo_plugin=TorchDynamoPlugin())",   # In[8]
        TRY_LAUNCH,
        RESET + "del state",
        "from transformers import TrainingArguments\n"
        "args = TrainingArguments(output_dir='unused', report_to=[])\nacc = Accelerator()",       # In[11]
        TRY_LAUNCH,
    ), timeout=600)
    accelerator = cell_text(nb.cells[2])
    assert "REFUSED: This notebook already holds an Accelerator or AcceleratorState" in accelerator
    assert "Accelerator at Cell In[2], line 2: accelerator = Accelerator()" in accelerator
    assert "held by `accelerator` (Accelerator)" in accelerator
    assert "Build Accelerator(...) inside the function" in accelerator
    partial = cell_text(nb.cells[5])
    assert "REFUSED: This notebook already holds a PartialState" in partial
    assert "PartialState at Cell In[5], line 2: print(PartialState().process_index)" in partial
    accelerator_state = cell_text(nb.cells[8])
    assert "AcceleratorState at Cell In[8], line 1" in accelerator_state
    assert "held by `state` (AcceleratorState)" in accelerator_state
    # TrainingArguments beside an Accelerator: not undone (the Accelerator holds more than the state)
    both = cell_text(nb.cells[11])
    assert "REFUSED:" in both and "TrainingArguments at Cell In[11], line 2" in both
    assert "Accelerator at Cell In[11], line 3" in both


def test_calls_inside_functions_and_classes_are_not_makers():
    cells = ["", "def train():\n    args = TrainingArguments('x')\n    return Accelerator()\n"
                 "class Box:\n    state = PartialState()\n"
                 "run = lambda: Accelerator()\n",
             "import transformers\nargs = transformers.TrainingArguments('x')"]
    assert [m.describe() for m in makers_in_cells(cells)] == [
        "TrainingArguments at Cell In[2], line 2: args = transformers.TrainingArguments('x')"]
    reset = ["from accelerate.state import AcceleratorState\nAcceleratorState._reset_state(True)"]
    assert makers_in_cells(cells + reset) == []   # what came before a reset no longer holds the state


def test_without_a_holder_bound_to_a_name_nothing_is_reset():
    """A state made by TrainingArguments kept in a dict cannot be refreshed: refuse instead."""
    origin = find_origin(False, namespace={"config": {"args": object()}},
                         cells=["", "config = {'args': TrainingArguments('x')}"])
    assert origin.resettable == () and origin.makers
