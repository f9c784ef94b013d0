"""mkdocs hooks (mkdocs.yml `hooks:`): the Benchmarks page shows the plots benchmarks/run.py drew.

benchmarks/run.py writes its SVG plots into docs/images/benchmarks/ from the same run as its table. The
page marks their place with ``<!-- PLOTS -->``; at build time that marker becomes one image per SVG
found there (sorted by name), or a line saying no plots were drawn yet, so the page never links to a
file that is not there (``mkdocs build --strict`` would fail on it) and a new plot needs no page edit.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

MARKER = "<!-- PLOTS -->"
PLOTS = Path("images") / "benchmarks"
TITLES = {
    "launch_cost": "Launch cost of a trivial function against rank count",
    "first_step": "Time to the first trained DDP step against rank count",
    "result_transfer": "A rank returns a state_dict: time against size, with the memcpy floor",
}


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if MARKER not in markdown:
        return markdown
    folder = Path(config["docs_dir"]) / PLOTS
    plots = sorted(folder.glob("*.svg")) if folder.is_dir() else []
    page_dir = Path(page.file.src_uri).parent
    if not plots:
        text = ("*No plots yet: `benchmarks/run.py` draws them into `docs/images/benchmarks/` "
                "from the run that writes the table.*")
    else:
        blocks = []
        for plot in plots:
            title = TITLES.get(plot.stem, plot.stem.replace("_", " "))
            rel = Path(*([".."] * len(page_dir.parts)), PLOTS, plot.name).as_posix()
            blocks.append(f"### {title}\n\n![{title}]({rel})\n")
        text = "## Plots\n\nDrawn by `benchmarks/run.py` from the same run as the table below.\n\n" + "\n".join(blocks)
    return markdown.replace(MARKER, text)
