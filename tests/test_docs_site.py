"""The documentation site builds with no warning and renders in a browser.

``mkdocs build --strict`` (warnings are errors: a broken link or anchor between pages, a missing image,
a docstring mkdocstrings cannot read) into a temporary folder; then every internal link of every built
page (navigation and generated API links included, which mkdocs' own check does not see) must lead to
a page that exists and to an anchor that page has; then the site, served over HTTP from that folder, is
opened in headless Debian chromium: the home page, the API reference, one guide and the benchmarks
show their headings and no "404", the guide's panel pictures and the benchmark plots load, and
screenshots go to test-artifacts/.

The API page's Parameters table comes from ``notebook_launcher``'s docstring (mkdocstrings), so the test
checks that it names every parameter the function takes: a new parameter without its line in the
docstring fails here.

Needs mkdocs, mkdocs-material and mkdocstrings[python] (the test extra) and, for the browser part,
Debian's chromium and playwright (as tests/test_browser_panel.py).
"""
from __future__ import annotations

import functools
import http.server
import inspect
import os
import shutil
import subprocess
import sys
import threading
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urldefrag, urlsplit

import pytest

REPO = Path(__file__).resolve().parent.parent
ARTIFACTS = REPO / "test-artifacts"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    pytest.importorskip("mkdocstrings_handlers.python")
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{output[-6000:]}"
    warnings = [line for line in output.splitlines() if line.startswith("WARNING")]
    assert not warnings, "\n".join(warnings)
    return out


class _Page(HTMLParser):
    """The ids and the internal links (href/src) of one built page."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in ("id", "name") and value:
                self.ids.add(value)
            if value and ((tag == "a" and name == "href") or (tag == "img" and name == "src")):
                self.links.append(value)


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


def test_every_internal_link_and_anchor_of_the_built_site_resolves(site):
    pages = {path: _parse(path) for path in site.rglob("*.html")}
    assert site / "index.html" in pages and site / "reference" / "api.html" in pages
    broken = []
    for path, page in pages.items():
        if path.name == "404.html":
            continue
        for link in page.links:
            parts = urlsplit(link)
            if parts.scheme or parts.netloc or link.startswith(("mailto:", "javascript:")):
                continue
            target_path, fragment = urldefrag(link)
            target = (path.parent / unquote(target_path)).resolve() if target_path else path
            if target.is_dir():
                target = target / "index.html"
            if not target.exists():
                broken.append(f"{path.relative_to(site)}: {link} (no such file)")
                continue
            if fragment and target.suffix == ".html":
                ids = pages[target].ids if target in pages else _parse(target).ids
                if unquote(fragment) not in ids:
                    broken.append(f"{path.relative_to(site)}: {link} (no anchor #{fragment})")
    assert not broken, "broken links in the built site:\n" + "\n".join(sorted(set(broken)))


def test_the_readme_is_short_and_its_links_lead_somewhere():
    """The README is for users (about 200 lines at most: issue 22); what it links to (the docs' sources,
    CONTRIBUTING.md, LICENSE) exists, and so does CONTRIBUTING.md's."""
    import re
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 200, f"README.md has {len(readme.splitlines())} lines; move detail to docs/"
    missing = []
    for name in ("README.md", "CONTRIBUTING.md"):
        for target in re.findall(r"\]\(([^)\s]+)\)", (REPO / name).read_text(encoding="utf-8")):
            path = target.split("#", 1)[0]
            if path and not urlsplit(path).scheme and not (REPO / path).exists():
                missing.append(f"{name}: {target}")
    assert not missing, missing
    assert "<this repository>" not in readme and "<you>" not in readme


def test_the_parameters_table_comes_from_the_docstring_and_names_every_parameter(site):
    from notebook_launch import notebook_launcher
    api = (site / "reference" / "api.html").read_text(encoding="utf-8")
    start = api.index('id="notebook_launch.notebook_launcher"')
    section = api[start:api.index('id="notebook_launch.RayCluster"')]
    assert "Parameters" in section, "the notebook_launcher docstring has no Args section for mkdocstrings to render"
    missing = [name for name in inspect.signature(notebook_launcher).parameters
               if f"<code>{name}</code>" not in section]
    assert not missing, f"parameters of notebook_launcher missing from the API page's table: {missing}"


@pytest.fixture(scope="module")
def served(site):
    """The built site over HTTP on 127.0.0.1 (the search and the theme's scripts load as on a web host)."""
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="needs Debian's chromium: bash scripts/system-packages.sh")
def test_the_site_renders_in_headless_chromium(served):
    pytest.importorskip("playwright")
    from playwright.sync_api import sync_playwright
    ARTIFACTS.mkdir(exist_ok=True)
    pages = [
        # (path, the page's title heading, headings that must be visible, screenshot)
        ("index.html", "notebook_launch", ["Where to go next"], "docs-home.png"),
        ("reference/api.html", "Python API", ["Launching", "notebook_launcher", "Persistent ranks",
                                              "start_ranks", "Ranks", "RayCluster", "progress", "load_metrics",
                                              "LaunchError", "Magics"], "docs-api.png"),
        ("guides/panel.html", "The live panel and progress()", ["progress() in your function",
                                                                "Metrics as curves"], "docs-guide-panel.png"),
        # its plots (when benchmarks/run.py drew them) must load too
        ("benchmarks.html", "Benchmarks", ["The table"], "docs-benchmarks.png"),
    ]
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            for path, title, headings, shot in pages:
                response = page.goto(f"{served}/{path}")
                assert response is not None and response.status == 200, (path, response and response.status)
                page.locator("article h1").first.wait_for(timeout=60_000)
                try:
                    assert page.locator("article h1").first.inner_text().strip().rstrip("¶").strip() == title
                    body = page.locator("article").inner_text()
                    assert "404" not in page.title() and "Page not found" not in body, path
                    for heading in headings:
                        found = page.locator("article :is(h2, h3)", has_text=heading).first
                        assert found.is_visible(), f"{path}: heading {heading!r} is not visible"
                    broken_images = page.evaluate(
                        "() => [...document.querySelectorAll('article img')]"
                        ".filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src)")
                    assert not broken_images, f"{path}: images that did not load: {broken_images}"
                finally:
                    page.screenshot(path=str(ARTIFACTS / shot), full_page=False)
            # the navigation reaches a guide from the home page, as a reader would
            page.goto(f"{served}/index.html")
            page.locator("article a", has_text="Moving from Accelerate").first.click()
            page.locator("article h1", has_text="Moving from Accelerate").wait_for(timeout=60_000)
        finally:
            browser.close()


def test_the_api_pages_signature_is_laid_out_one_parameter_a_line(site):
    """mkdocstrings-python formats signatures only where ruff or black is installed: the docs extra brings
    one (issue 35: from `pip install -e ".[docs]"` notebook_launcher's signature was one 1,500-character line)."""
    import re
    import tomllib
    extra = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    assert any(re.match(r"(ruff|black)\b", req) for req in extra["docs"]), extra["docs"]
    api = (site / "reference" / "api.html").read_text(encoding="utf-8")
    start = api.index('id="notebook_launch.notebook_launcher"')
    signature = api[start:].split('doc-signature', 1)[1].split("</code>", 1)[0]
    text = re.sub(r"<[^>]+>", "", signature)
    assert "\n    num_processes: int | None = None,\n" in text, text[:2000]
