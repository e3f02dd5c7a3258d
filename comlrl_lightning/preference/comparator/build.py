"""The comparator factory: the policy a :class:`~comlrl_lightning.preference.comparator.config.ComparatorConfig`
names, built over the team. It sits above the three policy modules (:mod:`.policies`,
:mod:`.history`, :mod:`.remote`), which import :mod:`.policies` and not each other.
"""

from __future__ import annotations

from typing import Any

from comlrl_lightning.preference.comparator.config import ComparatorConfig
from comlrl_lightning.preference.comparator.history import HistoryComparator
from comlrl_lightning.preference.comparator.policies import Comparator, TeamComparator
from comlrl_lightning.preference.comparator.remote import ApiComparator
from comlrl_lightning.team.centralized import CentralizedAdapter


def build_comparator(
    config: ComparatorConfig,
    team: Any,
    seed: int,
    sampling: dict[str, Any],
    history_dir: str | None = None,
    adapter: CentralizedAdapter | None = None,
) -> Comparator:
    """The comparator ``config`` names, over ``team`` (loads nothing yet: ``model`` loads on first
    sample, ``history`` at its first round).

    Args:
        sampling: the request's ``max_new_tokens`` / ``temperature`` / ``top_p`` / ``top_k`` (``api``).
        history_dir: ``history``'s folder when ``policy_checkpoint_dir`` is None (the module passes
            ``<default_root_dir>/policy_checkpoints``).
        adapter: the centralized joint format (CoMLRL's ``centralized_comparator_adapter``); None:
            :class:`~comlrl_lightning.team.centralized.TaggedAdapter`.

    Raises:
        ValueError: ``config.check(team.num_agents)`` fails, or ``history`` without any folder.
    """
    policy = config.comparator_policy
    if policy == "api":
        return ApiComparator(config, team.num_agents, seed, sampling, adapter=adapter)
    if policy == "history":
        directory = config.policy_checkpoint_dir or history_dir
        if not directory:
            raise ValueError("policy_checkpoint_dir: got None, comparator_policy='history' needs a folder")
        return HistoryComparator(config, team, seed, directory, adapter)
    return TeamComparator(config, team, seed, adapter)
