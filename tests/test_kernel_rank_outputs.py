"""What a rank writes or shows in a real Jupyter kernel reaches the cell, tagged, logged and
throttled: logging set up in the notebook, display()/update_display/clear_output (the
Transformers Trainer's notebook progress among them), and notebook classes in results."""
import os

import pytest
from helpers.nbutil import cell_text, make_notebook, run_notebook

PANEL = "<div class='nl-panel'"   # the widget panel's output once the run ended (display/widget.py)


def test_logging_set_up_in_the_notebook_is_tagged_logged_and_rate_limited(tmp_path):
    log_dir = str(tmp_path / "logs")
    nb = make_notebook(
        "import logging, sys\n"
        "logging.basicConfig(level=logging.INFO, format='%(levelname)s %(name)s %(message)s')\n"
        "saved_stdout = sys.stdout   # the kernel's OutStream, kept from before the launch\n"
        "from notebook_launch import notebook_launcher",
        "def talk(n):\n"
        "    import os\n"
        "    rank = os.environ['RANK']\n"
        "    log = logging.getLogger('talk')\n"
        "    log.info('hello from %s', rank)\n"
        "    print('saved stdout from', rank, file=saved_stdout)\n"
        "    for i in range(n):\n"
        "        log.info('flood %s %d', rank, i)\n"
        "    return rank",
        f"notebook_launcher(talk, args=(0,), num_processes=2, ui='text', log_dir={log_dir + '/tagged'!r})",
        f"notebook_launcher(talk, args=(100_000,), num_processes=2, ui='text', log_dir={log_dir + '/flood'!r})")
    nb = run_notebook(nb, timeout=300)
    lines = cell_text(nb.cells[2]).splitlines()
    assert "['0', '1']" in lines
    for rank in "01":
        assert f"[rank {rank}] INFO talk hello from {rank}" in lines
        assert f"[rank {rank}] saved stdout from {rank}" in lines
        with open(os.path.join(log_dir, "tagged", f"rank{rank}.log")) as f:
            log = f.read().splitlines()
        assert log.count(f"[stderr] INFO talk hello from {rank}") == 1
        assert f"saved stdout from {rank}" in log
    untagged = [line for line in lines if line.startswith(("INFO talk", "saved stdout"))]
    assert not untagged, untagged

    flood = cell_text(nb.cells[3]).splitlines()
    assert "['0', '1']" in flood
    for rank in "01":
        with open(os.path.join(log_dir, "flood", f"rank{rank}.log")) as f:
            logged = sum(1 for line in f if line.startswith(f"[stderr] INFO talk flood {rank} "))
        assert logged == 100_000
    untagged = [line for line in flood if line.startswith("INFO talk")]
    assert not untagged, untagged[:5]
    # like print(): the cell shows a bounded number of lines, the logs keep all 200,000
    assert len(flood) < 20_000, len(flood)


def _display_messages(messages, cell_index):
    """The ranks' display messages in a cell (the panel's own, its final picture included, left out)."""
    return [(kind, content) for index, kind, content in messages
            if index == cell_index and kind in ("display_data", "update_display_data", "clear_output")
            and PANEL not in _html(content)]


def _html(content):
    return content.get("data", {}).get("text/html", "")


SHOW = """
from IPython.display import HTML, clear_output, display, update_display
from notebook_launch import notebook_launcher

def show():
    import os
    rank = os.environ['RANK']
    handle = display(HTML(f'<b>rank {rank} step 0</b>'), display_id=True)
    for step in range(1, 200):
        handle.update(HTML(f'<b>rank {rank} step {step}</b>'))
    display(HTML(f'<i>rank {rank} before the clear</i>'))
    clear_output(wait=True)
    display(HTML(f'<i>rank {rank} after the clear</i>'))
    display(HTML(f'<u>rank {rank} first text</u>'), display_id='late')
    update_display(HTML(f'<u>rank {rank} late update</u>'), display_id='late')
    return rank
"""


def test_display_update_display_and_clear_output_of_a_rank_reach_the_cell():
    messages: list[tuple[int, str, dict]] = []   # (cell index, msg_type, content) of each IOPub message
    nb = run_notebook(make_notebook(SHOW, "notebook_launcher(show, num_processes=2)",
                                    "notebook_launcher(show, num_processes=2, display_ranks=[1])"),
                      messages=messages, timeout=300)
    shown = _display_messages(messages, 1)
    firsts = [c for kind, c in shown if kind == "display_data" and "rank 0 step 0" in _html(c)]
    assert len(firsts) == 1, shown
    step_id = firsts[0]["transient"]["display_id"]
    ids = {c["transient"]["display_id"] for kind, c in shown if kind == "display_data"}
    updates = [c for kind, c in shown if kind == "update_display_data"]
    assert updates and {c["transient"]["display_id"] for c in updates} <= ids  # rank ids mapped to ours
    assert step_id in {c["transient"]["display_id"] for c in updates}
    assert len(shown) < 100, len(shown)                  # 205 display calls, throttled
    assert not [c for kind, c in shown if kind == "clear_output"]  # a rank never clears the cell
    assert not [c for _, c in shown if "rank 1" in _html(c)]       # rank 0 only, by default
    final = [out for out in nb.cells[1].outputs if out.output_type == "display_data"]
    html = "\n".join(out.data.get("text/html", "") for out in final)
    assert "rank 0 after the clear" in html and "rank 0 late update" in html
    assert "before the clear" not in html and "step 199" not in html
    assert any(PANEL in out.data.get("text/html", "") for out in final), \
        "the panel (its final picture) must survive the rank's clear_output"

    html_of_rank_1_run = "\n".join(_html(c) for _, c in _display_messages(messages, 2))
    assert "rank 1 after the clear" in html_of_rank_1_run and "rank 0" not in html_of_rank_1_run


TRAINER = """
import tempfile
import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments
from notebook_launch import notebook_launcher

class RandomExamples(torch.utils.data.Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, i):
        generator = torch.Generator().manual_seed(i)
        return {"input_ids": torch.randint(0, 30, (8,), generator=generator), "labels": torch.tensor(i % 2)}

def train(output_dir):
    config = BertConfig(vocab_size=30, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=16, max_position_embeddings=16, num_labels=2)
    args = TrainingArguments(output_dir=output_dir, num_train_epochs=2, per_device_train_batch_size=2,
                             logging_steps=1, report_to=[], save_strategy="no", use_cpu=True,
                             disable_tqdm=False)
    trainer = Trainer(model=BertForSequenceClassification(config), args=args, train_dataset=RandomExamples())
    trainer.train()
    return trainer.state.global_step
"""


def test_the_transformers_trainer_notebook_progress_reaches_the_cell_and_every_ranks_row():
    """Rank 0's notebook bar and loss table in the cell (display_ranks); every rank's Trainer bar
    in its panel row (rank.integrations.transformers_bridge), as tqdm bars would be."""
    pytest.importorskip("transformers")
    import ast
    from helpers.panel_helpers import KEEP_STATES_CELL
    messages: list[tuple[int, str, dict]] = []   # (cell index, msg_type, content) of each IOPub message
    nb = run_notebook(make_notebook(TRAINER + KEEP_STATES_CELL,
                                    "print(notebook_launcher(train, args=(tempfile.mkdtemp(),), num_processes=2,"
                                    " ui=keeping()))\n"
                                    "print('BARS', (bars_of(0), bars_of(1)))"),
                      messages=messages, timeout=300)
    text = cell_text(nb.cells[1])
    assert "[8, 8]" in text   # 16 examples, 2 ranks, batch 2, 2 epochs
    rows = ast.literal_eval(text.split("BARS ", 1)[1].splitlines()[0])
    for bars, main in rows:
        assert main.startswith("Epoch 2"), rows
        assert [b[1:] for b in bars if b[0].startswith("Epoch")] == [(8, 8, True)], rows
    shown = _display_messages(messages, 1)
    bars = [c for kind, c in shown if kind == "display_data" and "<progress" in _html(c)]
    assert bars, shown
    bar_id = bars[0]["transient"]["display_id"]
    updates = [c for kind, c in shown if kind == "update_display_data" and c["transient"]["display_id"] == bar_id]
    assert updates and "Training Loss" in _html(updates[-1]) and "8/8" in _html(updates[-1])
    final = [out for out in nb.cells[1].outputs if out.output_type == "display_data"]
    assert any("Training Loss" in out.data.get("text/html", "") for out in final)
    assert any(PANEL in out.data.get("text/html", "") for out in final)   # the panel, ended as a picture


NOTEBOOK_CLASSES = """
import dataclasses, enum, typing
from notebook_launch import notebook_launcher

@dataclasses.dataclass
class Point:
    x: int
    y: int

class Color(enum.Enum):
    RED = 1
    BLUE = 2

class Pair(typing.NamedTuple):
    a: int
    b: str

class Outer:
    class Inner:
        pass

def make():
    import os
    rank = int(os.environ['RANK'])
    class Local:   # defined in the rank: only a copy can come back
        value = rank
    return {'point': Point(rank, 2), 'color': Color.BLUE, 'pair': Pair(rank, 'x'), 'class': Point,
            'nested': Outer.Inner(), 'local': Local}
"""

CHECK_CLASSES = """
results = notebook_launcher(make, num_processes=2, ui='none')
for rank, result in enumerate(results):
    assert isinstance(result['point'], Point) and result['point'] == Point(rank, 2)
    assert result['color'] is Color.BLUE
    assert type(result['pair']) is Pair and result['pair'] == Pair(rank, 'x')
    assert result['class'] is Point
    assert type(result['nested']) is Outer.Inner
    assert result['local'].value == rank
print('notebook classes came back as themselves')
"""


def test_notebook_classes_returned_by_forked_ranks_are_the_notebooks_own():
    nb = run_notebook(make_notebook(NOTEBOOK_CLASSES, CHECK_CLASSES), timeout=300)
    assert "notebook classes came back as themselves" in cell_text(nb.cells[1])
