"""The length-coordination toy task as a DataModule (see :mod:`comlrl_lightning.tasks.toy.env`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from comlrl_lightning.datamodules.decpomdp import DecPOMDPDataModule
from comlrl_lightning.tasks.toy.env import LengthRatioReward, length_ratio_rows


class LengthRatioDataModule(DecPOMDPDataModule):
    """Two agents write about a topic; agent 1 should write 2–3× as many characters as agent 0.

    Args:
        num_train: synthetic training episodes.
        num_val: synthetic validation episodes.
        lo, hi: the target ratio band.
        formatters: the two agents' prompt templates over the row field ``topic``.
        **kwargs: passed to :class:`DecPOMDPDataModule` (batch_size, seed, ...).
    """

    def __init__(
        self,
        num_train: int = 256,
        num_val: int = 16,
        lo: float = 2.0,
        hi: float = 3.0,
        formatters: Sequence[str] = ("Short note on {topic}:", "Longer note on {topic}:"),
        **kwargs: Any,
    ) -> None:
        super().__init__(formatters=formatters, reward=LengthRatioReward(lo, hi), **kwargs)
        self.num_train, self.num_val = num_train, num_val

    def load_train_val(self) -> tuple[Any, Any]:
        return length_ratio_rows(self.num_train, self.seed), length_ratio_rows(self.num_val, self.seed + 1)
