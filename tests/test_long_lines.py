"""Lines longer than the 64 KiB cut are cut on UTF-8 character boundaries, never inside one."""
import os

from notebook_launch import notebook_launcher
from notebook_launch.wire.line_splitter import MAX_LINE, LineSplitter


def test_cut_never_splits_a_multibyte_character():
    for prefix in range(4):                       # every alignment of 2-, 3- and 4-byte characters
        for char in ("é", "€", "😀"):
            data = ("a" * prefix + char * (2 * MAX_LINE // len(char.encode()))).encode() + b"\n"
            splitter = LineSplitter()
            lines = []
            for start in range(0, len(data), 4093):  # arbitrary read sizes
                lines += splitter.feed(data[start:start + 4093])
            lines += splitter.flush()
            assert "\ufffd" not in "".join(lines), (prefix, char)
            assert "".join(lines) == data[:-1].decode()
            assert all(len(line.encode()) <= MAX_LINE for line in lines[:-1]), "cut at most every 64 KiB"
            assert len(lines) >= 2


def test_invalid_utf8_still_makes_progress():
    splitter = LineSplitter()
    lines = splitter.feed(b"\x80" * (3 * MAX_LINE))
    assert sum(len(line) for line in lines) >= 2 * MAX_LINE - 8


def print_long_euro_line():
    print("€" * 100_000)


def test_long_line_of_a_rank_reaches_log_without_replacement_characters(log_dir, capsys):
    notebook_launcher(print_long_euro_line, num_processes=1, log_dir=log_dir)
    log = open(os.path.join(log_dir, "rank0.log"), encoding="utf-8").read()
    assert "\ufffd" not in log
    assert log.count("€") == 100_000
    assert "\ufffd" not in capsys.readouterr().out
