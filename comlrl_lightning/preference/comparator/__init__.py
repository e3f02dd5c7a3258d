"""The iterative trainers' comparator: who the current policy is compared with each round
(:mod:`~comlrl_lightning.preference.comparator.policies`, built by :mod:`~comlrl_lightning.preference.comparator.build`, :mod:`~comlrl_lightning.preference.comparator.history`,
:mod:`~comlrl_lightning.preference.comparator.remote`), its HTTP client (:mod:`~comlrl_lightning.preference.comparator.api`),
the centralized joint format (:mod:`comlrl_lightning.team.centralized`, shared with the centralized actor), one build batch
(:mod:`~comlrl_lightning.preference.comparator.candidates`), pairing (:mod:`~comlrl_lightning.preference.comparator.pairing`)
and the config (:mod:`~comlrl_lightning.preference.comparator.config`). Replay of earlier rounds' pairs is
:mod:`comlrl_lightning.preference.replay`. How they fit into a round: ``docs/iterative.md``.
"""

from comlrl_lightning.preference.comparator.api import ApiClient, ComparatorError
from comlrl_lightning.preference.comparator.build import build_comparator
from comlrl_lightning.preference.comparator.candidates import CandidateBatch, build_candidates
from comlrl_lightning.preference.comparator.config import ComparatorConfig, RoundsConfig
from comlrl_lightning.preference.comparator.pairing import (
    PAIR_SELECTION,
    comparison_order,
    pair_with_comparator,
    pairs_for_batch,
)
from comlrl_lightning.preference.comparator.policies import Comparator, ComparatorSample

__all__ = [
    "PAIR_SELECTION",
    "ApiClient",
    "CandidateBatch",
    "Comparator",
    "ComparatorConfig",
    "ComparatorError",
    "ComparatorSample",
    "RoundsConfig",
    "build_candidates",
    "build_comparator",
    "comparison_order",
    "pair_with_comparator",
    "pairs_for_batch",
]
