"""Line coverage per package from coverage.py's JSON report (`make coverage`):
    python -m bench.coverage_by_package coverage.json"""
import json
import sys
from collections import defaultdict


def by_package(report: dict) -> dict[str, tuple[int, int]]:
    """package -> (lines run, lines measured)."""
    totals = defaultdict(lambda: [0, 0])
    for path, data in report["files"].items():
        summary = totals[path.split("/")[0]]
        summary[0] += data["summary"]["covered_lines"]
        summary[1] += data["summary"]["num_statements"]
    return {name: (run, measured) for name, (run, measured) in sorted(totals.items())}


def main(path: str) -> None:
    print("| package | lines run / measured | coverage |\n|---|---|---|")
    for name, (run, measured) in by_package(json.load(open(path))).items():
        print(f"| {name} | {run} / {measured} | {100 * run / measured:.1f}% |")


if __name__ == "__main__":
    main(sys.argv[1])
