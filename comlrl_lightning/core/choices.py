"""One declaration per enumerated knob: :class:`Choice`.

Each choice is declared once, next to the code that implements its values (the baselines in
``core/advantages.py``, the loss types in ``core/loss.py``, ...). Everything else derives
from that declaration: the ``Literal`` type of the config field (``Choice.literal``, which
LightningCLI turns into the allowed list), validation and its error message (:meth:`Choice.check`),
the accepted aliases (:meth:`Choice.canonical`), and the lists in ``docs/choices.md`` and
``docs/architecture.md`` between ``<!-- choices:<field> -->`` markers, which ``python -m
comlrl_lightning.choice_docs`` writes (``tests/test_choices.py`` fails when they differ).

This module imports nothing from the package: a declaring module registers its choice by
creating it, and :mod:`comlrl_lightning.choice_docs`, which imports every declaring module, sits at
the top of the import graph.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

REGISTRY: dict[str, Choice] = {}
"""Field name -> its declaration (filled as the declaring modules are imported; all of them:
:data:`comlrl_lightning.choice_docs.DECLARING`)."""


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
