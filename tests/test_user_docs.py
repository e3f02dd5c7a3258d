"""What a user reads names things they can look up: no internal issue numbers in the docs, the
generated results, the Makefile, the configs or the package's docstrings."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
INTERNAL = re.compile(r"\b(?:GitHub )?issues? #?\d+", re.IGNORECASE)


def user_facing_files():
    for pattern in ("README.md", "Makefile", "docs/*.md", "benchmarks/*.md", "benchmarks/**/*.py", "configs/**/*.yaml",
                    "comlrl_lightning/**/*.py", "callbacks/*.py", "datamodules/*.py"):  # fmt: skip
        yield from ROOT.glob(pattern)


def test_no_internal_issue_numbers_where_users_read():
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}" for path in user_facing_files()
             for n, line in enumerate(path.read_text().splitlines(), 1) if INTERNAL.search(line)]  # fmt: skip
    assert found == []
