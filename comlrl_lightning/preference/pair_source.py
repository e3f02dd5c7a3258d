"""Where MARLHF's preference pairs come from: :class:`PairSourceConfig`.

Pairs are built from rollouts of the policy (:func:`~comlrl_lightning.preference.selection.build_preference_pairs`,
with :class:`~comlrl_lightning.preference.selection.PreferenceConfig`'s ``preference_num_candidates``,
``preference_pairs_per_sample`` and ``pair_selection``) over ``preference_num_prompts`` training
prompts, or read from a user's ``jsonl`` file (``pairs_path``,
:func:`~comlrl_lightning.preference.pairs.read_pairs`), e.g. human preferences.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lightning.pytorch.utilities import rank_zero_info

from comlrl_lightning.core.rollout import Actors
from comlrl_lightning.envs.base import DecPOMDP, Episode
from comlrl_lightning.preference.pairs import PreferencePair, read_pairs
from comlrl_lightning.preference.selection import PreferenceConfig, build_preference_pairs


@dataclass
class PairSourceConfig:
    """Which prompts MARLHF's pairs come from, or the file they are read from."""

    pairs_path: str | None = None
    """A ``jsonl`` pair file (``preference/pairs.py``'s format) to learn from instead of building pairs from
    rollouts: human preferences, or the pairs of an earlier run (``<reward_model_dir>/pairs.jsonl``).
    None: build them."""
    preference_num_prompts: int | None = None
    """Training prompts (the first ones of the train split, in order) whose candidates make pairs.
    None: every training prompt, as CoMLRL (one pass over its dataset)."""
    preference_batch_size: int = 1
    """Prompts per batched ``generate`` while building pairs (>= 1)."""

    def check(self) -> None:
        """Raises ValueError naming the field, the value and what is allowed."""
        n = self.preference_num_prompts
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ValueError(f"preference_num_prompts: got {n!r}, must be an integer >= 1 or null")
        b = self.preference_batch_size
        if isinstance(b, bool) or not isinstance(b, int) or b < 1:
            raise ValueError(f"preference_batch_size: got {b!r}, must be an integer >= 1")
        if self.pairs_path is not None and (not isinstance(self.pairs_path, str) or not self.pairs_path):
            raise ValueError(f"pairs_path: got {self.pairs_path!r}, give a jsonl file's path or null")


def collect_pairs(
    cfg: PairSourceConfig,
    preference: PreferenceConfig,
    env: DecPOMDP,
    rows: Sequence[Any] | None,
    actors: Actors,
    num_agents: int,
) -> list[PreferencePair]:
    """The pairs of ``cfg``: ``pairs_path``'s, else built (``preference``'s knobs) from ``actors``' rollouts (one batched
    ``generate`` per agent per ``preference_batch_size`` prompts) of the first
    ``preference_num_prompts`` of ``rows`` (a datamodule's ``train_rows``), scored by ``env``'s reward.

    Raises:
        RuntimeError: pairs are to be built but there are no ``rows``.
        ValueError: as :func:`~comlrl_lightning.preference.pairs.read_pairs` (a bad line, another agent count).
    """
    if cfg.pairs_path is not None:
        pairs = read_pairs(cfg.pairs_path, num_agents)
        rank_zero_info(f"MARLHF phase 1: {len(pairs)} preference pairs read from {cfg.pairs_path}; training the "
                       "reward model (the RL phase follows)")  # fmt: skip
        return pairs
    if rows is None:
        raise RuntimeError(
            "building preference pairs needs a DecPOMDPDataModule (its train_rows), or pairs_path"
        )
    n = len(rows) if cfg.preference_num_prompts is None else min(cfg.preference_num_prompts, len(rows))
    rank_zero_info(f"MARLHF phase 1: building preference pairs from {n} prompts x {preference.preference_num_candidates} "
                   "joint responses, then training the reward model (the RL phase follows)")  # fmt: skip
    episodes = [Episode(i, dict(rows[i])) for i in range(n)]
    pairs: list[PreferencePair] = []
    for s in range(0, n, cfg.preference_batch_size):
        built = build_preference_pairs(
            env,
            episodes[s : s + cfg.preference_batch_size],
            actors,
            preference.preference_num_candidates,
            preference.pair_selection,
            preference.preference_pairs_per_sample,
        )
        pairs.extend(built.pairs)
    return pairs


def config_group(cls: type, value: Any, name: str) -> Any:
    """``value`` (None, a mapping or a ``cls``) as a checked copy of ``cls``: a config group of
    MARLHF (``reward_model``, ``preference``, ``pair_source``) given from Python, YAML or hparams.

    Raises:
        ValueError: an unknown field or a bad value (naming ``name``), or a value of another type.
    """
    if isinstance(value, dict):
        try:
            value = cls(**value)
        except TypeError as err:
            raise ValueError(f"{name}: {err}") from None
    if not isinstance(value, cls | None):
        raise ValueError(f"{name}: got a {type(value).__name__}, give a {cls.__name__} or a mapping")
    value = cls() if value is None else copy.copy(value)
    if hasattr(value, "check"):  # PreferenceConfig checks itself when built
        value.check()
    return value
