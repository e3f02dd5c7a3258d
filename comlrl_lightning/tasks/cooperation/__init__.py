"""Cooperation tasks: a shared reward that depends on how the agents' answers interact.

Three kinds (:data:`COOPERATION_TASK`), each a module with its problems, prompts and reward:
:mod:`.coordination` (name the same option, seen in different orders), :mod:`.division` (take
different items of the same list) and :mod:`.dependence` (agent 1 names a secret only agent 0
saw, from agent 0's message; two turns). Content: :mod:`.words` (training and held-out categories
are disjoint). :mod:`.datamodule`'s ``CooperationDataModule`` (public as
``comlrl_lightning.datamodules.CooperationDataModule``) serves them; see ``docs/cooperation.md``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from comlrl_lightning.core.choices import Choice
from comlrl_lightning.tasks.cooperation import coordination, dependence, division

COOPERATION_TASK = Choice(
    "cooperation_task",
    {
        "coordination": "both agents see the same options in different orders; 1.0 when they name the same one",
        "division": "both see the same items; 1.0 when each names exactly one and the two differ",
        "dependence": "agent 0 sees a secret and writes a message; at turn 1 agent 1 must name the secret (2 turns)",
    },
)
"""The ``data.task`` values of :class:`~comlrl_lightning.datamodules.CooperationDataModule`."""


@dataclass(frozen=True)
class CooperationTask:
    """What one kind of cooperation task is made of.

    Attributes:
        rows: ``(n, seed, split, num_options) -> rows`` (``split``: ``"train"`` or ``"held_out"``).
        formatters: the two agents' turn-0 prompt templates.
        reward: builds the shared reward function.
        pool: ``(split, num_options) -> n``: how many distinct problems ``rows`` can give.
        num_turns: turns per episode (``rollout.num_turns`` must equal it).
        num_options: the default number of options per problem.
        transition: builds the transition (multi-turn tasks), or None.
    """

    rows: Callable[[int, int, str, int], list[dict[str, Any]]]
    formatters: tuple[str, str]
    reward: Callable[[], Any]
    pool: Callable[[str, int], int]
    num_turns: int = 1
    num_options: int = 4
    transition: Callable[[], Any] | None = None


TASKS: dict[str, CooperationTask] = {
    "coordination": CooperationTask(
        coordination.coordination_rows,
        coordination.FORMATTERS,
        coordination.CoordinationReward,
        coordination.coordination_pool,
    ),
    "division": CooperationTask(
        division.division_rows,
        division.FORMATTERS,
        division.DivisionReward,
        division.division_pool,
        num_options=3,
    ),
    "dependence": CooperationTask(
        dependence.dependence_rows,
        dependence.FORMATTERS,
        dependence.DependenceReward,
        dependence.dependence_pool,
        num_turns=2,
        transition=dependence.MessageTransition,
    ),
}
"""Each :data:`COOPERATION_TASK` value's parts."""

__all__ = ["COOPERATION_TASK", "TASKS", "CooperationTask"]
