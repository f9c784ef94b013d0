"""Each rank's output: captured at the fd level, tagged, whole lines, complete logs on disk."""
import ctypes
import json
import os
import subprocess
import sys
import textwrap

from helpers.rank_logs import written_by_rank

from notebook_launch import notebook_launcher


def talk():
    rank = os.environ["RANK"]
    print(f"python stdout from {rank}")
    print(f"python stderr from {rank}", file=sys.stderr)
    os.write(1, f"fd-level write from {rank}\n".encode())
    libc = ctypes.CDLL(None)
    libc.printf(f"C printf from {rank}\n".encode())   # C stdio buffer: flushed at exit
    sys.stdout.write("no newline at the end")
    return rank


def test_output_is_tagged_and_complete(log_dir, capsys):
    assert notebook_launcher(talk, num_processes=2, log_dir=log_dir) == ["0", "1"]
    out, err = capsys.readouterr()
    for rank in "01":
        assert f"[rank {rank}] python stdout from {rank}\n" in out
        assert f"[rank {rank}] fd-level write from {rank}\n" in out
        assert f"[rank {rank}] C printf from {rank}\n" in out
        assert f"[rank {rank}] no newline at the end\n" in out
        assert f"[rank {rank}] python stderr from {rank}\n" in err
        log = open(os.path.join(log_dir, f"rank{rank}.log")).read()
        assert f"python stdout from {rank}\n" in log
        assert f"[stderr] python stderr from {rank}\n" in log
        assert f"C printf from {rank}\n" in log


def chatter(lines):
    rank = os.environ["RANK"]
    payload = rank * 3000          # long lines: several pipe-buffer pieces each
    for i in range(lines):
        print(f"{rank}:{i}:{payload}")


def test_lines_of_different_ranks_never_mix(log_dir, capsys):
    notebook_launcher(chatter, args=(300,), num_processes=3, log_dir=log_dir)
    out = capsys.readouterr().out
    seen = {r: 0 for r in "012"}
    for line in out.splitlines():
        if not line.startswith("[rank "):
            continue
        tag, _, body = line.partition("] ")
        rank = tag[len("[rank "):]
        r, i, payload = body.split(":")
        assert r == rank and payload == rank * 3000, "a line was cut or mixed with another rank's"
        assert int(i) == seen[rank]
        seen[rank] += 1
    assert seen == {r: 300 for r in "012"}


def test_custom_line_prefix(log_dir, capsys):
    notebook_launcher(print, args=("hi",), num_processes=2, log_dir=log_dir,
                      log_line_prefix_template="[{role_name}-{rank}]:")
    out = capsys.readouterr().out
    assert "[default-0]: hi\n" in out and "[default-1]: hi\n" in out


def test_default_log_dir_is_a_new_folder_per_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("NOTEBOOK_LAUNCH_LOG_DIR", str(tmp_path / "root"))
    notebook_launcher(print, args=("first",), num_processes=1)
    notebook_launcher(print, args=("second",), num_processes=1)
    runs = sorted((tmp_path / "root").iterdir())
    assert len(runs) == 2
    out = capsys.readouterr().out
    for run in runs:
        assert f"logs: {run}" in out
    assert written_by_rank(runs[0] / "rank0.log") == "first\n"
    assert written_by_rank(runs[1] / "rank0.log") == "second\n"


MILLION_LINES = textwrap.dedent("""
    import json, os, resource, sys
    from notebook_launch import notebook_launcher

    def flood():
        write = sys.stdout.write
        for i in range(1_000_000):
            write(f"line {i} of a flood that the notebook could never show\\n")
        return "done"

    def peak_mb():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    notebook_launcher(int, num_processes=1, ui="none", log_dir=sys.argv[1] + "/warm")
    before = peak_mb()
    result = notebook_launcher(flood, num_processes=1, log_dir=sys.argv[1] + "/flood")
    print(json.dumps({"before": before, "after": peak_mb(), "result": result}), file=sys.stderr)
""")


def test_a_million_lines_keep_memory_bounded_and_reach_the_log(tmp_path):
    script = tmp_path / "flood.py"
    script.write_text(MILLION_LINES)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path)], stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    stats = json.loads(proc.stderr.strip().splitlines()[-1])
    assert stats["result"] == ["done"]
    assert stats["after"] - stats["before"] < 100, f"parent memory grew by {stats['after'] - stats['before']:.0f} MB"
    flood, ours = 0, []
    with open(tmp_path / "flood" / "rank0.log") as f:
        for line in f:
            if line.startswith("line "):
                flood += 1
            else:
                ours.append(line)
    assert flood == 1_000_000
    # beside the rank's own, only notebook_launch's lines (its resources now and then)
    assert all(line.startswith("[notebook_launch] ") for line in ours), ours[:5]
