"""The first examples a newcomer reads run as written: the README's ten-line example and Getting started's
first launch (issue 35: it had `...` and an undefined `loss`).

The README's ten-line example, run as written (from a script: forked ranks, the text display), shows what
data parallelism is: each rank trains on its own batches (different losses per rank at the same step) and
DDP leaves every rank with the same weights. Issue 35: with `torch.randn` and no per-rank seed, forked ranks
inherited one random state and logged identical losses, which reads as something broken."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _example(page: str, heading: str) -> str:
    text = (REPO / page).read_text(encoding="utf-8")
    section = text[text.index(heading):]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block, f"no python block after {heading!r} in {page}"
    return block.group(1)


def _run(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    call = "num_processes=2)"
    assert code.count(call) == 1, code
    # its own port: other tests on this shared machine launch on the default one at the same time
    code = code.replace(
        call, "num_processes=2, use_port=str(__import__('notebook_launch.planning.net').planning.net.free_port()))")
    script = tmp_path / "example.py"
    script.write_text(code, encoding="utf-8")
    env = dict(os.environ, NOTEBOOK_LAUNCH_LOG_DIR=str(tmp_path / "runs"))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240, env=env,
                          cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_the_readme_example_gives_each_rank_its_own_data(tmp_path):
    code = _example("README.md", "## A ten-line example")
    code += (
        "\nimport json, torch"
        "\nfrom notebook_launch import load_metrics"
        "\nprint('SAME WEIGHTS', all(torch.equal(states[0][k], states[1][k]) for k in states[0]))"
        "\nprint('METRICS', json.dumps(load_metrics(pandas=False)))\n")
    proc = _run(code, tmp_path)
    assert "SAME WEIGHTS True" in proc.stdout, proc.stdout[-3000:]
    metrics = json.loads(proc.stdout.split("METRICS ", 1)[1].splitlines()[0])
    losses: dict[int, dict[int, float]] = {0: {}, 1: {}}
    for rank, metric, step, value in zip(metrics["rank"], metrics["metric"], metrics["step"], metrics["value"]):
        if metric == "loss":
            losses[rank][step] = value
    steps = sorted(set(losses[0]) & set(losses[1]))
    assert len(steps) >= 100, losses
    same = [s for s in steps if losses[0][s] == losses[1][s]]
    assert not same, f"ranks 0 and 1 logged the same loss at steps {same[:10]}: they trained on the same data"
    # and it trains: the last losses are far below the first
    assert losses[0][steps[-1]] < losses[0][steps[0]] / 10, losses[0]


def test_getting_starteds_first_launch_runs_as_written(tmp_path):
    code = _example("docs/getting-started.md", "## The first launch")
    proc = _run(code + "\nimport torch\nprint('SAME WEIGHTS', torch.equal(results[0]['weight'], results[1]['weight']))"
                       "\nprint('LOSSES', [r['loss'] for r in results])\n", tmp_path)
    assert "[rank 0] rank 0: final loss" in proc.stdout and "[rank 1] rank 1: final loss" in proc.stdout, proc.stdout
    # the same weights (DDP), each rank its own data (different losses on their own last batches)
    assert "SAME WEIGHTS True" in proc.stdout, proc.stdout
    losses = json.loads(proc.stdout.split("LOSSES ", 1)[1].splitlines()[0])
    assert losses[0] != losses[1] and max(losses) < 0.1, losses
