"""The code blocks of ``docs/architecture.md`` marked ``<!-- from: <file> -->`` are the code: each
run of lines between elisions (a line ``    ...`` standing for a class body left out) appears,
contiguous and exactly as formatted, in that file (so a refactor that changes the code fails here
until the doc follows; ``ruff format`` leaves such blocks as they are)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"<!-- from: (\S+) -->\n```python\n(.*?)```", re.S)


ELISION = "    ..."


def quoted_blocks(text: str) -> list[tuple[str, list[str]]]:
    """``(file, run of lines)`` for every run between elisions of every marked block (blank lines
    around an elision dropped)."""
    out = []
    for path, code in BLOCK.findall(text):
        for run in "\n".join(code.splitlines()).split(f"\n{ELISION}\n"):
            out.append((path, run.strip("\n").splitlines()))
    return out


def appears_in(lines: list[str], source: list[str]) -> bool:
    return any(source[i : i + len(lines)] == lines for i in range(len(source) - len(lines) + 1))


def test_architecture_code_blocks_are_quoted_from_the_code():
    blocks = quoted_blocks((ROOT / "docs/architecture.md").read_text())
    assert (
        len(blocks) >= 5
    )  # the corridor, the shared rollout (each with its class line), the Actors protocol
    stale = [path for path, lines in blocks if not appears_in(lines, (ROOT / path).read_text().splitlines())]
    assert not stale, f"docs/architecture.md quotes code that is no longer in {stale}"


def test_a_changed_line_is_caught():
    source = ["def f():", "    return 1", ""]
    assert appears_in(["def f():", "    return 1"], source)
    assert not appears_in(["def f():", "    return 2"], source)
