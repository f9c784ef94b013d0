"""Print one closing line over every test lane's JUnit XML: ``total: N passed, N failed, N skipped``.

scripts/test.sh runs several pytest lanes (each in its own venv); each prints its own summary, and this
line adds them up so the end of the log speaks for the whole run. Exits 1 when a lane failed or a file
is missing (a lane that crashed before writing its report must not pass silently).
"""
from __future__ import annotations

import sys
import xml.etree.ElementTree as ET


def lane_counts(path: str) -> tuple[int, int, int]:
    """(passed, failed, skipped) of one JUnit XML file; errors count as failures."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    tests = failed = skipped = 0
    for suite in suites:
        tests += int(suite.get("tests", 0))
        failed += int(suite.get("failures", 0)) + int(suite.get("errors", 0))
        skipped += int(suite.get("skipped", 0))
    return tests - failed - skipped, failed, skipped


def main(paths: list[str]) -> int:
    passed = failed = skipped = 0
    missing = []
    for path in paths:
        try:
            p, f, s = lane_counts(path)
        except (OSError, ET.ParseError):
            missing.append(path)
            continue
        print(f"{path}: {p} passed, {f} failed, {s} skipped")
        passed, failed, skipped = passed + p, failed + f, skipped + s
    if missing or not paths:
        print(f"no readable report: {', '.join(missing) or '(none given)'}")
        failed += max(1, len(missing))
    print(f"total: {passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
