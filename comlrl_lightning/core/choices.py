"""One declaration per enumerated knob: :class:`Choice`.

Each choice is declared once, next to the code that implements its values (the baselines in
``core/advantages.py``, the loss types in ``core/loss.py``, ...). Everything else derives
from that declaration: the ``Literal`` type of the config field (``Choice.literal``, which
LightningCLI turns into the allowed list), validation and its error message (:meth:`Choice.check`),
the accepted aliases (:meth:`Choice.canonical`), and the lists in ``docs/choices.md`` and
``docs/architecture.md`` between ``<!-- choices:<field> -->`` markers, which ``python -m
comlrl_lightning.core.choices`` writes (``tests/test_choices.py`` fails when they differ).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

REGISTRY: dict[str, Choice] = {}
"""Field name -> its declaration (filled as the declaring modules are imported)."""


@dataclass(frozen=True)
class Choice:
    """The allowed values of one config field, each with a one-line meaning (and source).

    Attributes:
        field: the config field's name (``advantage_mode``), as error messages and docs name it.
        values: value -> meaning, in the order docs list them.
        aliases: accepted other spellings -> the value each one is (CoMLRL's or older names).
    """

    field: str
    values: dict[str, str]
    aliases: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        REGISTRY[self.field] = self

    @property
    def names(self) -> tuple[str, ...]:
        """The canonical values, in declaration order."""
        return tuple(self.values)

    @property
    def literal(self) -> Any:
        """``Literal[...]`` of every accepted spelling (canonical values, then aliases)."""
        return Literal[(*self.values, *self.aliases)]

    def check(self, value: Any) -> None:
        """Raises ValueError naming the field, the value and the allowed values, unless ``value`` is one."""
        if value not in self.values and value not in self.aliases:
            raise ValueError(f"{self.field}: got {value!r}, allowed: {[*self.values, *self.aliases]}")

    def canonical(self, value: Any) -> str:
        """``value`` checked, with an alias replaced by the value it is (Raises ValueError as :meth:`check`)."""
        self.check(value)
        return self.aliases.get(value, value)

    def markdown(self) -> str:
        """The list the docs show between this field's markers."""
        lines = [f"- `{v}`: {meaning}" for v, meaning in self.values.items()]
        lines += [f"- `{a}`: accepted spelling of `{v}`" for a, v in self.aliases.items()]
        return "\n".join(lines)


_MARKED = re.compile(r"(<!-- choices:([\w.]+) -->\n).*?(<!-- /choices -->)", re.S)


def render(text: str) -> str:
    """``text`` with every ``<!-- choices:<field> --> ... <!-- /choices -->`` block rewritten from
    the field's declaration. Raises KeyError for a marker naming an undeclared field."""
    load_all()
    return _MARKED.sub(lambda m: f"{m[1]}{REGISTRY[m[2]].markdown()}\n{m[3]}", text)


def load_all() -> None:
    """Import every module that declares a choice (the config imports them all)."""
    import comlrl_lightning.algorithms.madpo  # noqa: F401
    import comlrl_lightning.algorithms.marlhf  # noqa: F401
    import comlrl_lightning.comparator.config  # noqa: F401
    import comlrl_lightning.comparator.pairing  # noqa: F401
    import comlrl_lightning.core.config  # noqa: F401
    import comlrl_lightning.core.replay  # noqa: F401
    import comlrl_lightning.envs.reward_model  # noqa: F401
    import comlrl_lightning.tasks.cooperation  # noqa: F401
    import comlrl_lightning.team.critics  # noqa: F401


DOCS = ("docs/choices.md", "docs/architecture.md")
"""The files whose choice lists are generated, relative to the repository root."""
ROOT = Path(__file__).resolve().parents[2]


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


if __name__ == "__main__":  # run as a script: use the imported module, whose REGISTRY the declarations fill
    from comlrl_lightning.core.choices import main as _main

    sys.exit(_main())
