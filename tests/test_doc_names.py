"""The docs and the package's docstrings name our modules where they live now (issue 46 moved many, and
sentences that named the old paths kept reading well while pointing at nothing). The rule and why it is so
precise (which tokens are checked, what resolves) are in helpers/doc_names.py; these tests hold it to the whole
tree and to made-up tokens, so that a rule that checks nothing cannot pass unnoticed."""
from __future__ import annotations

from pathlib import Path

import pytest

from helpers import doc_names
from helpers.doc_names import is_stale, moved_away_names, stale_names, tokens_in


real_locate = doc_names.locate


def test_docs_and_docstrings_name_modules_where_they_are() -> None:
    checked = {path.relative_to(doc_names.ROOT).parts[0] for path in doc_names.checked_files()}
    assert {"docs", "notebook_launch", "tests", "benchmarks", "scripts", "README.md"} <= checked, checked
    stale = stale_names()
    listing = "\n".join(f"  {path}: {', '.join(tokens)}" for path, tokens in sorted(stale.items()))
    assert not stale, f"these files name modules by a path that no longer resolves (CHANGELOG.md says where " \
                      f"each moved):\n{listing}"


def test_an_old_path_is_caught() -> None:
    assert "backends" in moved_away_names() and "ray_serve" in moved_away_names()
    for old in ("backends.fork", "rank.ray_serve.serve_ray_calls", "persistent.slurm_ranks",
                "ray_ranks.RayTransport", "notebook_launch.rank.start_server", "slurm.ranks.RemoteRank",
                "supervise.oom.NoSuchWatch", "rank.made_up_module", "ray_serve", "slurm_ranks",
                "start.py", "display/resources.py", "notebook_launch/engines/local/elastic.py"):
        assert is_stale(old), old


def test_relative_external_and_foreign_names_pass() -> None:
    for fine in ("oom.MemoryWatch", "supervise.oom.MemoryWatch", "notebook_launch.engines.local.fork",
                 "engines.remote.serve.serve_ray_calls", "slurm.task", "local.persistent.LocalTransport",
                 "state.stop_requested", "ray.get", "ray.util.placement_group", "state.json",
                 "err.rank", "xmp.spawn", "ranks.run", "start", "rank/preload", "engines/base.py", "state.py",
                 "notebook_launch/rank/", "version.py"):
        assert not is_stale(fine), fine


def test_the_failure_names_the_file_and_its_token(tmp_path: Path) -> None:
    module = tmp_path / "made_up.py"
    module.write_text('"""Uses ``backends.spawn`` and ``oom.MemoryWatch``."""\n'
                      'x = 1   # kept as rank.ray_actor did\n'
                      'def f() -> None:\n    """Like ``rank/ray_serve.py``, plain rank.start_server too."""\n')
    assert {"backends.spawn", "oom.MemoryWatch", "rank.ray_actor", "rank/ray_serve.py",
            "rank.start_server"} <= tokens_in(module.read_text(), python=True)
    assert stale_names([module]) == {str(module): ["backends.spawn", "rank.ray_actor", "rank.start_server",
                                                   "rank/ray_serve.py"]}


def test_a_library_not_installed_here_cannot_fail_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """``ray`` is an extra: a lane without it must not fail on the docs' ``ray.init``."""
    assert not is_stale("ray.init") and is_stale("ray.util.no_such_function")  # ray is read where installed
    monkeypatch.setattr(doc_names, "locate", lambda name: None if name.split(".")[0] == "ray" else real_locate(name))
    assert not is_stale("ray.init") and not is_stale("ray.util.no_such_function")
