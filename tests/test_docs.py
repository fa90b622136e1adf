"""The docs hold together: CI runs the README's test command verbatim, and every relative link
of the user docs reaches a file and, where it names one, a heading of that file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CI_MARK = "# The README's test command, verbatim:"
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
LINK = re.compile(r"\]\(([^)\s]+)\)")
DOCS = [
    "README.md",
    "CONTRIBUTING.md",
    "ARCHITECTURE.md",
    "protocol/README.md",
    "docker/README.md",
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")),
]


def _ci_test_command() -> str:
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    return lines[lines.index(CI_MARK) + 1].strip()


def _code_lines(markdown: str) -> set[str]:
    return {line.strip() for block in FENCE.findall(markdown) for line in block.splitlines()}


def test_ci_runs_the_readme_test_command() -> None:
    command = _ci_test_command()
    assert "pytest" in command
    assert command in _code_lines((ROOT / "README.md").read_text())
    assert command in _code_lines((ROOT / "CONTRIBUTING.md").read_text())


def _slugs(markdown: str) -> set[str]:
    """GitHub's anchors for the headings: lower case, punctuation dropped, spaces to hyphens."""
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#+\s+(.+?)\s*$", FENCE.sub("", markdown), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        if count:
            seen[f"{slug}-{count}"] = 1
    return set(seen)


def _links(path: str) -> list[str]:
    text = FENCE.sub("", (ROOT / path).read_text())
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]


@pytest.mark.parametrize("path", DOCS)
def test_relative_links_resolve(path: str) -> None:
    broken = []
    for target in _links(path):
        file, _, anchor = target.partition("#")
        resolved = (ROOT / path).parent / file if file else ROOT / path
        if not resolved.exists():
            broken.append(target)
        elif anchor and resolved.suffix == ".md" and anchor not in _slugs(resolved.read_text()):
            broken.append(target)
    assert broken == []


def test_slugs_follow_github() -> None:
    text = "# Runs 36-39: a message (2026-12-01 17:56 UTC)\n## `--op-deadline` rules\n## X\n## X"
    assert _slugs(text) == {
        "runs-36-39-a-message-2026-12-01-1756-utc",
        "--op-deadline-rules",
        "x",
        "x-1",
    }
