"""Compare two JUnit XML runs of scikit-learn's array-API tests, array_api_strict against
Tensorwire, case by case (the namespace's name in the ids made the same).

    python tools/sklearn_compare.py STRICT.xml TENSORWIRE.xml
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET  # noqa: S405 - our own pytest's output, not untrusted input
from collections import Counter

BAD = ("failure", "error")
RANK = {"error": 3, "failure": 2, "skipped": 1, "passed": 0}
Outcome = tuple[str, str, float]  # status, message, seconds


def load(path: str, namespace: str) -> dict[str, Outcome]:
    """Each case's worst outcome (a failure and a teardown error: the error)."""
    cases: dict[str, Outcome] = {}
    for case in ET.parse(path).getroot().iter("testcase"):  # noqa: S314
        name = f"{case.get('classname')}::{case.get('name')}".replace(namespace, "NS")
        status, message = "passed", ""
        for child in case:
            if child.tag in (*BAD, "skipped"):
                status, message = child.tag, child.get("message") or ""
                break
        outcome = (status, message, float(case.get("time") or 0.0))
        if name not in cases or RANK[status] > RANK[cases[name][0]]:
            cases[name] = outcome
    return cases


def main(strict_xml: str, tensorwire_xml: str) -> None:
    strict = load(strict_xml, "array_api_strict")
    ours = load(tensorwire_xml, "client.array_api")
    common = set(strict) & set(ours)
    for label, cases in (("array_api_strict", strict), ("Tensorwire", ours)):
        counts = Counter(cases[k][0] for k in common)
        print(
            f"{label}: {len(cases)} cases; of the {len(common)} both ran: "
            + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        )
    print("failing on Tensorwire only:")
    for name in sorted(k for k in common if ours[k][0] in BAD and strict[k][0] not in BAD):
        print(f"  {name}\n    {ours[name][1][:200]}")
    print("failing on array_api_strict only:")
    for name in sorted(k for k in common if strict[k][0] in BAD and ours[k][0] not in BAD):
        print(f"  {name}\n    {strict[name][1][:200]}")
    only = sorted(set(strict) - set(ours))
    print(
        f"run on array_api_strict only (they name it): {len(only)}, "
        f"failing: {sum(strict[k][0] in BAD for k in only)}"
    )
    print("five slowest Tensorwire cases (setup + call + teardown):")
    for name in sorted(ours, key=lambda k: -ours[k][2])[:5]:
        theirs = strict[name][2] if name in strict else float("nan")
        print(f"  {ours[name][2]:6.2f} s (array_api_strict {theirs:5.2f} s)  {name}")


if __name__ == "__main__":
    main(*sys.argv[1:])
