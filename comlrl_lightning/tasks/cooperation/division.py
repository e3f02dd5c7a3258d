"""Division of labour: both agents see the same items and must take different ones.

Both agents see the same items in the same order (agent 0 is told it is partner A, agent 1 partner
B). The shared reward is 1.0 when each names exactly one of the items and the two differ (together
they cover two distinct parts of the work), else 0.0. A reply that names two or more items takes no
item (:func:`~comlrl_lightning.tasks.cooperation.words.one_choice`): read as "the first item named",
" chef, baker" / " baker, chef" would count as a split, and a team that lists the items in opposite
orders wins every problem without choosing (the first rule allowed it: 400 of 400 training problems).
Neither agent can raise the reward alone: a valid, distinct part from each is needed, and which part is
whose is a split the team must settle on. The prompts say what wins, not who takes what.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from comlrl_lightning.envs.rewards import PASS_AT_1, RewardResult
from comlrl_lightning.tasks.cooperation.words import (
    draw,
    listing,
    named_options,
    one_choice,
    orderings,
    two_choices,
    unique_rows,
)

FORMATTERS = (
    "You and a partner each take one of these {category}: {view0}. You win if you take different ones. "
    "You are partner A.\nI take:",
    "You and a partner each take one of these {category}: {view0}. You win if you take different ones. "
    "You are partner B.\nI take:",
)
"""Agent 0's and agent 1's prompt templates (the same items, in the same order; only the role differs)."""


def division_rows(n: int, seed: int, split: str, num_options: int = 3) -> list[dict[str, Any]]:
    """``n`` distinct problems: ``{"category", "options", "view0"}`` (from the ``split`` word bank).

    Raises:
        ValueError: ``num_options`` not in [2, 8], a bad ``split``, or too few distinct problems.
    """

    def make(rng: Any) -> dict[str, Any]:
        category, words = draw(rng, split, num_options)
        return {"category": category, "options": words, "view0": listing(words)}

    return unique_rows(make, n, seed, division_pool(split, num_options))


def division_pool(split: str, num_options: int) -> int:
    """How many distinct problems :func:`division_rows` can give for ``split``: an ordered draw of ``num_options`` words of one category."""
    return orderings(split, num_options)


class DivisionReward:
    """1.0 when each agent names exactly one of the episode's ``options`` and the two differ, else 0.0.

    Also reports :data:`~comlrl_lightning.envs.rewards.PASS_AT_1` (the same value), ``overlap`` (1.0
    where both took one item and it is the same one: the collision a split has to avoid) and
    ``several`` (the share of the two agents whose reply names two or more items: no choice).

    Raises:
        ValueError: a joint action without exactly two completions.
    """

    name = "division"

    def __call__(
        self, joint_actions: Sequence[Sequence[str]], episodes: Sequence[Any], turn: int
    ) -> RewardResult:
        values, overlap, several = [], [], []
        for ja, ep in zip(joint_actions, episodes):
            options = ep.data["options"]
            a, b = two_choices("DivisionReward", ja, options, parse=one_choice)
            values.append(float(a is not None and b is not None and a != b))
            overlap.append(float(a is not None and a == b))
            several.append(sum(len(named_options(text, options)) > 1 for text in ja) / 2)
        return RewardResult(values, {PASS_AT_1: list(values), "overlap": overlap, "several": several})
