"""The tag in front of every output line of a rank (``log_line_prefix_template``).

Two syntaxes, so code written for either anchor keeps its output: torch elastic's
``string.Template`` (``"${role_name}-${rank}: "``, what Accelerate hands to torchrun, rendered
as torchrun renders it) and ``str.format`` (``"[{rank}]: "``, this package's earlier syntax).
A template containing ``$`` is torch's; braces are then plain text. A template is checked
when the launch starts, so a typo is a LaunchArgumentError before any rank runs, never a
crash at a rank's first line of output.
"""
from __future__ import annotations

import string
from dataclasses import dataclass

from ..errors import LaunchArgumentError

FIELDS = ("rank", "local_rank", "role_name", "node_rank")
ROLE_NAME = "default"          # torchrun's role when none is given
DEFAULT_TEMPLATE = "[rank {rank}]"


@dataclass(frozen=True)
class LinePrefix:
    """A checked template; ``render`` gives the text put before a line (separator included)."""
    template: str
    torch_syntax: bool

    def render(self, *, rank: int, local_rank: int, node_rank: int = 0) -> str:
        fields = {"rank": rank, "local_rank": local_rank, "role_name": ROLE_NAME, "node_rank": node_rank}
        if self.torch_syntax:
            text = string.Template(self.template).substitute(fields)
        else:
            text = self.template.format(**fields)
        # One space before the line, unless the template ends with its own whitespace
        # (torchrun puts the line right after the prefix: "[${rank}]: " is common).
        return text if text[-1:].isspace() else text + " "


def parse_line_prefix(template: object) -> LinePrefix:
    """Check ``log_line_prefix_template``; None gives the default ``[rank N]`` tag."""
    if template is None:
        return LinePrefix(DEFAULT_TEMPLATE, torch_syntax=False)
    if not isinstance(template, str):
        raise LaunchArgumentError(
            f"log_line_prefix_template must be a str such as '[${{rank}}]: ' (torchrun's syntax) or "
            f"'[{{rank}}]: ', or None; got {type(template).__name__}")
    if "$" in template:
        _check_torch_template(template)
        return LinePrefix(template, torch_syntax=True)
    _check_format_template(template)
    return LinePrefix(template, torch_syntax=False)


def _bad(template: str, why: str) -> LaunchArgumentError:
    return LaunchArgumentError(
        f"log_line_prefix_template={template!r} {why}. Use the fields "
        + ", ".join(f"${{{name}}}" for name in FIELDS)
        + " (torchrun's syntax, e.g. '[${rank}]: '; '$$' is a literal $) or "
        + ", ".join(f"{{{name}}}" for name in FIELDS) + " (e.g. '[{rank}]: ').")


def _check_torch_template(template: str) -> None:
    for match in string.Template.pattern.finditer(template):
        if match.group("invalid") is not None:
            where = match.start()
            raise _bad(template, f"has a '$' at position {where} that starts no field")
        name = match.group("named") or match.group("braced")
        if name is not None and name not in FIELDS:
            raise _bad(template, f"names an unknown field ${{{name}}}")


def _check_format_template(template: str) -> None:
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise _bad(template, f"is not a valid format string ({exc})") from None
    for _, name, _, _ in parsed:
        if name is None:
            continue
        if name not in FIELDS:
            shown = "{" + name + "}" if name else "{} (a field needs a name)"
            raise _bad(template, f"names an unknown field {shown}")
    try:  # format specs and conversions ("{rank:>3}", "{rank!r}") are checked by using them once
        template.format(rank=0, local_rank=0, role_name=ROLE_NAME, node_rank=0)
    except (ValueError, KeyError, IndexError, AttributeError) as exc:
        raise _bad(template, f"cannot be formatted ({type(exc).__name__}: {exc})") from None
