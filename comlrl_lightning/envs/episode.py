"""The Dec-POMDP episode: one dataset row (:mod:`~comlrl_lightning.envs.base` re-exports it beside the
protocol; the rewards that score episodes import it from here)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Episode:
    """One Dec-POMDP episode: the dataset row it starts from.

    Attributes:
        index: the row's index in its split (stable across epochs; used in logs and for resume).
        data: the row's fields, e.g. ``{"prompt": ..., "test": ...}``.
    """

    index: int
    data: dict[str, Any] = field(default_factory=dict)
