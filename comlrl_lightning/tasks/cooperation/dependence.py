"""Dependence: agent 0 holds a secret, agent 1 must name it from agent 0's message (two turns).

Turn 0: agent 0 sees the secret (one of the options) and writes a short message; agent 1 sees only
the options (in another order: the reverse). Turn 1: agent 1 sees agent 0's message and names an
option; agent 0's turn-1 reply is not scored. The shared reward is 0.0 at turn 0 and, at turn 1, 1.0
when agent 1 names the secret. Neither agent can raise it alone: agent 1 cannot know the secret
(chance: one in the number of options) unless agent 0's message carries it, and a message helps only
when agent 1 reads it. The prompts ask for a message, not for what it should say.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from comlrl_lightning.envs.rewards import PASS_AT_1, RewardResult
from comlrl_lightning.tasks.cooperation.words import (
    draw,
    listing,
    orderings,
    parse_choice,
    two_choices,
    unique_rows,
)

FORMATTERS = (
    "The secret is {secret}. Your partner must find it among these {category}: {view0}.\nMy message to my partner:",
    "Your partner knows which of these {category} is the secret: {view1}. Wait for their message.\nOK:",
)
"""Turn 0: agent 0 (sees the secret) and agent 1 (sees only the options, reversed)."""

TURN_1 = (
    "Your partner is guessing now.\nOK:",
    "Their message:{completion_of_agent_0}\nThe secret is:",
)
"""Turn 1 prompt templates (:class:`MessageTransition` fields: the row's and ``completion_of_agent_0``)."""


def dependence_rows(n: int, seed: int, split: str, num_options: int = 4) -> list[dict[str, Any]]:
    """``n`` distinct problems: ``{"category", "options", "secret", "view0", "view1"}``; ``secret`` one
    of ``options``, ``view1`` the options reversed (from the ``split`` word bank, drawn with ``seed``).

    Raises:
        ValueError: ``num_options`` not in [2, 8], a bad ``split``, or too few distinct problems.
    """

    def make(rng: Any) -> dict[str, Any]:
        category, words = draw(rng, split, num_options)
        return {
            "category": category,
            "options": words,
            "secret": rng.choice(words),
            "view0": listing(words),
            "view1": listing(words[::-1]),
        }

    return unique_rows(make, n, seed, dependence_pool(split, num_options))


def dependence_pool(split: str, num_options: int) -> int:
    """How many distinct problems :func:`dependence_rows` can give for ``split``: an ordered draw of ``num_options`` words of one category and which of them is the secret."""
    return orderings(split, num_options) * num_options


class MessageTransition:
    """Turn 1's prompts (:data:`TURN_1` unless given): each template may use the row's fields and
    ``{completion_of_agent_0}`` (agent 0's turn-0 message, as written); the episode ends after turn 1.

    Raises:
        ValueError: not two templates.
    """

    def __init__(self, templates: Sequence[str] = TURN_1) -> None:
        if len(templates) != 2:
            raise ValueError(f"MessageTransition.templates: got {len(templates)}, need 2 (one per agent)")
        self.templates = list(templates)

    def __call__(self, episode: Any, turn: int, prompts: Any, completions: Any) -> Sequence[str] | None:
        if turn >= 1:
            return None
        fields = {**episode.data, "completion_of_agent_0": completions[0][-1]}
        return [t.format(**fields) for t in self.templates]


class DependenceReward:
    """0.0 at turn 0; at turn 1, 1.0 when agent 1's reply names the episode's ``secret``, else 0.0.

    Also reports :data:`~comlrl_lightning.envs.rewards.PASS_AT_1` (turn 1: the same value; turn 0:
    0.0) and ``message_names_secret`` (turn 0: 1.0 where agent 0's message contains the secret word).

    Raises:
        ValueError: a joint action without exactly two completions.
    """

    name = "dependence"

    def __call__(
        self, joint_actions: Sequence[Sequence[str]], episodes: Sequence[Any], turn: int
    ) -> RewardResult:
        values, told = [], []
        for ja, ep in zip(joint_actions, episodes):
            secret = ep.data["secret"]
            _, answer = two_choices("DependenceReward", ja, ep.data["options"])
            told.append(float(parse_choice(ja[0], [secret]) is not None))
            values.append(0.0 if turn == 0 else float(answer == secret))
        return RewardResult(values, {PASS_AT_1: list(values), "message_names_secret": told})
