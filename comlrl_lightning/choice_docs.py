"""The choice lists in the docs, generated from the declarations (:class:`~comlrl_lightning.core.choices.Choice`).

    python -m comlrl_lightning.choice_docs   # rewrites the lists in docs/choices.md and docs/architecture.md

Between ``<!-- choices:<field> -->`` and ``<!-- /choices -->`` the docs show the field's values, each
with its meaning; ``tests/test_choices.py`` fails when a list is stale. This module imports every
module that declares a choice (:data:`DECLARING`; the test checks it against the source), so it sits
at the top of the import graph and nothing in the package imports it.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from comlrl_lightning.algorithms import madpo, marlhf
from comlrl_lightning.core import (
    advantages,
    credit,
    dpo,
    generation,
    loss,
    nonfinite,
    pairs,
    replay,
    td,
)
from comlrl_lightning.core.choices import REGISTRY
from comlrl_lightning.envs import reward_model, trl_reward
from comlrl_lightning.infra import placement
from comlrl_lightning.preference.comparator import config as comparator_config
from comlrl_lightning.tasks import cooperation

DECLARING = (
    advantages,
    comparator_config,
    cooperation,
    credit,
    dpo,
    generation,
    loss,
    madpo,
    marlhf,
    nonfinite,
    pairs,
    placement,
    replay,
    reward_model,
    td,
    trl_reward,
)
"""Every module that declares a :class:`~comlrl_lightning.core.choices.Choice` at module level."""

DOCS = ("docs/choices.md", "docs/architecture.md")
"""The files whose choice lists are generated, relative to the repository root."""
ROOT = Path(__file__).resolve().parents[1]

_MARKED = re.compile(r"(<!-- choices:([\w.]+) -->\n).*?(<!-- /choices -->)", re.S)


def render(text: str) -> str:
    """``text`` with every ``<!-- choices:<field> --> ... <!-- /choices -->`` block rewritten from
    the field's declaration. Raises KeyError for a marker naming an undeclared field."""
    return _MARKED.sub(lambda m: f"{m[1]}{REGISTRY[m[2]].markdown()}\n{m[3]}", text)


def main(root: Path = ROOT) -> int:
    """Rewrite the generated lists in :data:`DOCS`; prints the files changed."""
    for rel in DOCS:
        path = root / rel
        old = path.read_text()
        new = render(old)
        if new != old:
            path.write_text(new)
            print(f"wrote {rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
