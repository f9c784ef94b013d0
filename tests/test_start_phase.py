"""What a rank's row says while it starts (issue 47, part 4): a short first run sat at "running
00:00" with every row "starting" for seconds (the notebook importing torch once for every rank
before the fork), then jumped to "done". The rows now say what takes the time, and stop saying it
once the ranks run. A fresh Python (torch not imported yet), as a new kernel's first launch."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from notebook_launch.display import format as fmt
from notebook_launch.record.state import RUNNING, STARTING, RankState, RunState

FIRST_LAUNCH = textwrap.dedent("""
    import json, sys
    from notebook_launch import notebook_launcher
    from notebook_launch.display.base import Display
    from notebook_launch.display import format as fmt

    class Phases(Display):
        seen = []
        def refresh(self, state):
            self.seen += [fmt.phase(rs) for rs in state.ranks if fmt.phase(rs)]
        def close(self, state):
            self.final = [rs.phase for rs in state.ranks]

    def uses_torch():
        import torch
        return torch.ones(1).item()

    assert "torch" not in sys.modules
    display = Phases()
    notebook_launcher(uses_torch, num_processes=2, ui=display, log_dir=sys.argv[1], start_method=sys.argv[2])
    print("PHASES " + json.dumps({"seen": sorted(set(display.seen)), "final": display.final}))
""")


@pytest.mark.parametrize("start_method,said", [
    ("fork", "importing torch (once, for every rank)"),
    ("spawn", "waiting for the warm start process to import torch")])
def test_the_rows_say_torch_is_being_imported_while_they_start(tmp_path, start_method, said):
    done = subprocess.run([sys.executable, "-c", FIRST_LAUNCH, str(tmp_path), start_method], capture_output=True,
                          text=True, timeout=240)
    line = [x for x in done.stdout.splitlines() if x.startswith("PHASES ")]
    assert line, done.stdout + done.stderr
    phases = json.loads(line[-1][len("PHASES "):])
    assert said in phases["seen"], phases
    assert phases["final"] == ["", ""], phases


def test_a_phase_shows_only_while_a_rank_starts_or_runs_without_a_bar():
    state = RunState("r", 2, "fork", "/tmp/logs", [RankState(0, 0, status=STARTING), RankState(1, 1)])
    state.on_phase(None, "importing torch (once, for every rank)")
    assert fmt.phase(state.ranks[0]) == "importing torch (once, for every rank)"
    state.ranks[1].status = RUNNING
    state.on_phase(None, "")
    assert fmt.phase(state.ranks[0]) == fmt.phase(state.ranks[1]) == ""
