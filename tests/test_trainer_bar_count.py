"""The Transformers Trainer's notebook bar ends at its true count on every rank's row.

Once in a CI run rank 1's row read "Epoch 9/8": the Trainer's ``on_step_end`` calls
``update(global_step + 1)``, so after the last step the notebook bar's ``value`` is 9 of 8 (it
clamps only what it draws) until ``on_train_end`` sets 8; when the rank's sender published
between the two, 9 was the last count sent, since a count that moved back was not published.
Here the send lands there every time: a callback after the notebook's own forces it on the
last step (``rank.reports.progress``'s flush, as the sender thread would do it). Real ranks, a real
Trainer with a tiny model built from a config (no downloads); the notebook callback is added by
hand because outside a kernel the Trainer picks its terminal (tqdm) bar."""
from __future__ import annotations

import pytest

from notebook_launch import notebook_launcher
from notebook_launch.display.base import Display


class RecordingCounts(Display):
    """Every count any bar showed, and the bars at the end."""
    name = "recording"

    def __init__(self) -> None:
        super().__init__()
        self.counts: list[tuple[int, str, float, float | None]] = []
        self.final: dict[int, list] = {}

    def refresh(self, state) -> None:
        self.counts += [(rs.rank, bar.desc, bar.n, bar.total) for rs in state.ranks for bar in rs.bars.values()]

    def close(self, state) -> None:
        self.refresh(state)
        self.final = {rs.rank: list(rs.bars.values()) for rs in state.ranks}


def train_with_a_send_after_the_last_step(output_dir: str) -> int:
    import torch
    from transformers import (BertConfig, BertForSequenceClassification, Trainer, TrainerCallback,
                              TrainingArguments)
    from transformers.trainer_callback import ProgressCallback
    from transformers.utils.notebook import NotebookProgressCallback

    from notebook_launch.rank.reports import progress

    class RandomExamples(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 16

        def __getitem__(self, i: int) -> dict:
            generator = torch.Generator().manual_seed(i)
            return {"input_ids": torch.randint(0, 30, (8,), generator=generator), "labels": torch.tensor(i % 2)}

    class SendAfterTheLastStep(TrainerCallback):
        """Runs after the notebook callback's ``on_step_end``: the sender's send, at the worst moment."""

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == state.max_steps:
                reporter = progress.reporter()
                assert reporter is not None   # in a rank
                reporter.flush()

    config = BertConfig(vocab_size=30, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=16, max_position_embeddings=16)
    config.num_labels = 2
    args = TrainingArguments(output_dir=output_dir, num_train_epochs=2, per_device_train_batch_size=2,
                             logging_steps=1, report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=False)
    trainer = Trainer(model=BertForSequenceClassification(config), args=args, train_dataset=RandomExamples())
    trainer.remove_callback(ProgressCallback)
    trainer.add_callback(NotebookProgressCallback)
    trainer.add_callback(SendAfterTheLastStep)
    trainer.train()
    return trainer.state.global_step


def test_the_trainer_notebook_bar_never_passes_its_total_and_ends_at_it(tmp_path):
    pytest.importorskip("transformers")
    display = RecordingCounts()
    steps = notebook_launcher(train_with_a_send_after_the_last_step, args=(str(tmp_path / "out"),),
                              num_processes=2, ui=display, log_dir=str(tmp_path / "logs"))
    assert steps == [8, 8]   # 16 examples, 2 ranks, batch 2, 2 epochs
    over = [count for count in display.counts if count[3] is not None and count[2] > count[3]]
    assert not over, over
    for rank, bars in display.final.items():
        epochs = [(bar.n, bar.total) for bar in bars if bar.desc.startswith("Epoch")]
        assert epochs == [(8, 8)], (rank, bars)
