"""Coordination: both agents see the same options in different orders and must name the same one.

Agent 0 sees the options in the problem's order, agent 1 in the reverse order. The shared reward is
1.0 when both name the same option and 0.0 otherwise (a reply that names no option never matches).
Neither agent can raise it alone: whatever one says, the reward depends on whether the other says
the same thing. The prompts say what wins, not how to win: which option to agree on (a position, a
word) is a convention the team must learn, and it must hold for held-out categories never seen in
training (:mod:`~comlrl_lightning.tasks.cooperation.words`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from comlrl_lightning.envs.rewards import PASS_AT_1, RewardResult
from comlrl_lightning.tasks.cooperation.words import draw, listing, orderings, two_choices, unique_rows

FORMATTERS = (
    "You and a partner each pick one of these {category}: {view0}. You win if you pick the same one.\nI pick:",
    "You and a partner each pick one of these {category}: {view1}. You win if you pick the same one.\nI pick:",
)
"""Agent 0's and agent 1's prompt templates over a row's fields (``view1`` is ``view0`` reversed)."""


def coordination_rows(n: int, seed: int, split: str, num_options: int = 4) -> list[dict[str, Any]]:
    """``n`` distinct problems: ``{"category", "options", "view0", "view1"}``; ``options`` in agent 0's
    order, ``view1`` the reverse (from the ``split`` word bank, drawn with ``seed``).

    Raises:
        ValueError: ``num_options`` not in [2, 8], a bad ``split``, or too few distinct problems.
    """

    def make(rng: Any) -> dict[str, Any]:
        category, words = draw(rng, split, num_options)
        return {
            "category": category,
            "options": words,
            "view0": listing(words),
            "view1": listing(words[::-1]),
        }

    return unique_rows(make, n, seed, coordination_pool(split, num_options))


def coordination_pool(split: str, num_options: int) -> int:
    """How many distinct problems :func:`coordination_rows` can give for ``split``: an ordered draw of ``num_options`` words of one category (agent 1's view is its reverse)."""
    return orderings(split, num_options)


class CoordinationReward:
    """1.0 when both agents name the same option of the episode's ``options``, else 0.0.

    Also reports :data:`~comlrl_lightning.envs.rewards.PASS_AT_1` (the same value: a matched pair
    solves the problem) and ``valid`` (the fraction of the two agents whose reply names an option).

    Raises:
        ValueError: a joint action without exactly two completions.
    """

    name = "coordination"

    def __call__(
        self, joint_actions: Sequence[Sequence[str]], episodes: Sequence[Any], turn: int
    ) -> RewardResult:
        values, valid = [], []
        for ja, ep in zip(joint_actions, episodes):
            a, b = two_choices("CoordinationReward", ja, ep.data["options"])
            values.append(float(a is not None and a == b))
            valid.append(((a is not None) + (b is not None)) / 2)
        return RewardResult(values, {PASS_AT_1: list(values), "valid": valid})
