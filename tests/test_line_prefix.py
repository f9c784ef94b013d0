"""log_line_prefix_template: torchrun's string.Template syntax as torchrun renders it, the
str.format syntax as before, and a bad template refused before any rank starts."""
import pytest

from notebook_launch import LaunchArgumentError, notebook_launcher
from notebook_launch.record.line_prefix import parse_line_prefix


@pytest.mark.parametrize("template,expected", [
    ("${role_name}-${rank}: ", "default-3: "),          # Accelerate -> torchrun printed "$default-$0:" before
    ("[${rank}]:", "[3]: "),                             # torch's docstring example; one space added
    ("[$rank/$local_rank] ", "[3/1] "),
    ("$$ ${rank} {curly}: ", "$ 3 {curly}: "),            # torch syntax: braces are plain text
    ("[{role_name}-{rank}]:", "[default-3]: "),
    ("{rank:>3}|", "  3| "),
    (None, "[rank 3] "),
])
def test_both_syntaxes_render(template, expected):
    assert parse_line_prefix(template).render(rank=3, local_rank=1) == expected


@pytest.mark.parametrize("template,why", [
    ("${rnak}: ", "unknown field ${rnak}"),
    ("$rank_id: ", "unknown field ${rank_id}"),
    ("cost $5 [${rank}]", "'$' at position 5"),
    ("[{rnak}]", "unknown field {rnak}"),
    ("[{}]", "a field needs a name"),
    ("[{rank]", "not a valid format string"),
    ("{rank:q}", "cannot be formatted"),
    (12, "must be a str"),
])
def test_bad_templates_name_the_problem(template, why):
    with pytest.raises(LaunchArgumentError) as info:
        parse_line_prefix(template)
    assert why in str(info.value) and "log_line_prefix_template" in str(info.value)


def test_torchrun_syntax_tags_every_line(log_dir, capsys):
    notebook_launcher(print, args=("hi",), num_processes=2, log_dir=log_dir,
                      log_line_prefix_template="${role_name}-${rank}: ")
    out = capsys.readouterr().out
    assert "default-0: hi\n" in out and "default-1: hi\n" in out
    assert "$default" not in out


def must_not_run():
    raise AssertionError("a rank started despite a bad template")


def test_bad_template_fails_before_any_rank_starts(log_dir, capsys):
    with pytest.raises(LaunchArgumentError, match=r"unknown field \$\{rnak\}"):
        notebook_launcher(must_not_run, num_processes=2, log_dir=log_dir,
                          log_line_prefix_template="[${rnak}] ")
    assert "notebook_launch: 2 ranks" not in capsys.readouterr().out, "nothing may start"
