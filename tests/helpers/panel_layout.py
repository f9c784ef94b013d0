"""The panel's layout measured in a real page (tests/test_browser_panel.py, issue 47): where each
rank's bar is, how many lines each row takes, and which figure, if any, the page cuts.

``measure(page, cell)`` reads bounding boxes from the DOM of one cell's panel (live widgets or the
final picture: the rows' markup is the same); the ``assert_*`` functions say what a person would
see wrong in words."""
from __future__ import annotations

from typing import Any

LINE = 20    # px: the panel's line height (display/rows.py FONT)

MEASURE = """(index) => {
  const cell = [...document.querySelectorAll('.jp-CodeCell')][index];
  const panel = cell.querySelector('.nl-panel');
  if (!panel) return null;
  const box = e => { const r = e.getBoundingClientRect(); return {x: r.x, y: r.y, w: r.width, h: r.height,
                                                                  right: r.right}; };
  const output = panel.closest('.jp-OutputArea-output') || panel;
  const right = Math.min(output.getBoundingClientRect().right, panel.getBoundingClientRect().right);
  const rows = [...panel.querySelectorAll('tr.nl-rank')].map(row => {
    const cut = [];
    for (const item of row.querySelectorAll('.nl-items > *:not(.nl-last-line):not(.nl-bar-track)')) {
      const parts = [item, ...item.querySelectorAll('span')];
      for (const part of parts) {
        const style = getComputedStyle(part);
        if (part.scrollWidth > part.clientWidth + 1 && style.overflow != 'visible') cut.push(part.textContent);
        if (style.textOverflow == 'ellipsis' && style.overflow != 'visible') cut.push(part.textContent);
        if (part.getBoundingClientRect().right > right + 1) cut.push('beyond the output: ' + part.textContent);
      }
      if (item.textContent.includes('\u2026') || item.textContent.includes('...')) cut.push(item.textContent);
    }
    const figures = [...row.querySelectorAll('.nl-items span')].filter(
      s => getComputedStyle(s).whiteSpace == 'nowrap' && !s.closest('.nl-last-line'));
    const last = row.querySelector('.nl-last-line');
    if (last && last.getBoundingClientRect().right > right + 1) {
      cut.push('beyond the output (' + last.getBoundingClientRect().right + ' > ' + right + '): ' + last.textContent);
    }
    return {text: row.innerText, row: box(row), label: box(row.querySelector('.nl-label')),
            name: box(row.querySelector('.nl-label b')), badge: box(row.querySelector('.nl-status')),
            bar: box(row.querySelector('.nl-bar-track')), cut: cut,
            tallest_figure: Math.max(0, ...figures.map(s => s.getBoundingClientRect().height))};
  });
  return {panel: box(panel), output: box(output), rows: rows, table: box(panel.querySelector('.nl-rows')),
          live: cell.querySelectorAll('.jupyter-widgets').length > 0};
}"""


def measure(page: Any, index: int) -> dict[str, Any]:
    found = page.evaluate(MEASURE, index)
    assert found is not None, f"no panel in cell {index}"
    return found


def assert_rows_laid_out(found: dict[str, Any], where: str, max_lines: int = 2) -> None:
    """Every row's bar starts at the same x with the same width; the label is one line (its badge
    beside the rank's name, not under it); a row takes at most ``max_lines`` lines (its figures
    wrap, whole, under the bar); no figure is cut or hidden."""
    rows = found["rows"]
    assert len(rows) >= 2, (where, found)
    bars = [(round(r["bar"]["x"]), round(r["bar"]["w"])) for r in rows]
    assert len(set(bars)) == 1, f"{where}: the rows' bars do not line up (x, width): {bars}"
    assert bars[0][1] >= 90, f"{where}: a bar of {bars[0][1]} px"
    for r in rows:
        assert abs(r["badge"]["y"] - r["name"]["y"]) < LINE / 2, f"{where}: the badge fell under the name: {r}"
        assert r["label"]["h"] <= LINE + 4, f"{where}: the label wraps: {r}"
        assert r["tallest_figure"] <= LINE + 4, f"{where}: a figure wraps inside itself: {r}"
        assert r["row"]["h"] <= max_lines * LINE + 8, f"{where}: a row of {r['row']['h']} px: {r['text']!r}"
        assert not r["cut"], f"{where}: figures cut: {r['cut']}"


def assert_same_height(live: float, picture: float) -> None:
    """The final picture keeps the live panel's height (within 10%)."""
    assert abs(picture - live) <= 0.1 * live, f"the panel was {live:.0f} px high live, its picture {picture:.0f} px"
