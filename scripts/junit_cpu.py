"""Print where a pytest lane's CPU went, from its JUnit XML's ``cpu_s`` properties
(tests/helpers/cpu_per_test.py): the total, then the files that burnt most, each with its costliest test.

    python scripts/junit_cpu.py test-artifacts/junit-main.xml [--top 15]
"""
from __future__ import annotations

import argparse
import collections
import xml.etree.ElementTree as ET


def cpu_by_test(path: str) -> dict[str, float]:
    """``{nodeid-ish: cpu seconds}`` for each test that carries the property."""
    spent: dict[str, float] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        for prop in case.iter("property"):
            if prop.get("name") == "cpu_s":
                try:
                    spent[f"{case.get('classname')}::{case.get('name')}"] = float(prop.get("value", ""))
                except ValueError:
                    pass
    return spent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("junit")
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    spent = cpu_by_test(args.junit)
    if not spent:
        print(f"{args.junit}: no cpu_s properties")
        return 0
    by_file: dict[str, float] = collections.defaultdict(float)
    costliest: dict[str, tuple[float, str]] = {}
    for test, seconds in spent.items():
        module = test.split("::", 1)[0]
        by_file[module] += seconds
        costliest[module] = max(costliest.get(module, (0.0, "")), (seconds, test.split("::", 1)[1]))
    print(f"CPU of {len(spent)} tests: {sum(spent.values()):.0f} s; the files that burnt most:")
    for module, seconds in sorted(by_file.items(), key=lambda kv: -kv[1])[:args.top]:
        most, name = costliest[module]
        print(f"  {seconds:7.1f} s  {module}  (costliest: {most:.1f} s {name[:70]})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
