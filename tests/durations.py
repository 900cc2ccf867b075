"""The suite's cost, from the JUnit reports `make test` leaves in test-reports/ (main.xml, main-second.xml, vllm.xml).

    python tests/durations.py                  # the ten slowest tests and files of the last `make test`
    python tests/durations.py --top 30 test-reports/main.xml

Every test's duration is kept in those files (pytest's `--junitxml`; a test's time is its set-up, call and
tear-down, so a module-scoped run shared by several tests is charged to the first that asks for it). This prints
each lane's total, the slowest tests and the slowest files. It measures and prints; it asserts nothing (no test
may assert a wall time).
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

REPORTS = Path(__file__).resolve().parents[1] / "test-reports"


def read(report: Path) -> list[tuple[str, str, float]]:
    """(file, test id, seconds) of every test case in one JUnit report."""
    cases = []
    for case in ET.parse(report).getroot().iter("testcase"):
        parts = case.get("classname", "").split(".")  # tests.test_x, or tests.test_x.TestClass
        ends = [i for i, part in enumerate(parts) if part.startswith("test_")]
        file = "/".join(parts[: ends[0] + 1]) + ".py" if ends else ".".join(parts)
        cases.append((file, f"{file}::{case.get('name', '?')}", float(case.get("time") or 0.0)))
    return cases


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="*", type=Path, help="JUnit XML files (default: test-reports/*.xml)")
    parser.add_argument("--top", type=int, default=10, help="how many tests and files to list (default 10)")
    args = parser.parse_args(argv)
    reports = args.reports or sorted(REPORTS.glob("*.xml"))
    if not reports:
        print(f"no JUnit reports in {REPORTS}: run make test first", file=sys.stderr)
        return 2
    cases = []
    for report in reports:
        lane = read(report)
        cases += lane
        print(f"{report.name}: {len(lane)} tests, {sum(t for *_, t in lane) / 60:.1f} min in tests")
    by_file: dict[str, float] = defaultdict(float)
    for file, _, seconds in cases:
        by_file[file] += seconds
    print(f"\nslowest {args.top} tests:")
    for _, test, seconds in sorted(cases, key=lambda c: -c[2])[: args.top]:
        print(f"  {seconds:7.1f} s  {test}")
    print(f"\nslowest {args.top} files:")
    for file, seconds in sorted(by_file.items(), key=lambda f: -f[1])[: args.top]:
        print(f"  {seconds:7.1f} s  {file}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
