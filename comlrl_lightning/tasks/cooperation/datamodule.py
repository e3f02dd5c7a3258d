"""The cooperation tasks as one DataModule (see :mod:`comlrl_lightning.tasks.cooperation`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from comlrl_lightning.datamodules.decpomdp import DecPOMDPDataModule
from comlrl_lightning.envs.base import Formatter
from comlrl_lightning.tasks.cooperation import COOPERATION_TASK, TASKS

CooperationTaskName = COOPERATION_TASK.literal


class CooperationDataModule(DecPOMDPDataModule):
    """Two agents, one cooperation task: training problems from the training categories, held-out
    problems (the validation split) from categories never seen in training.

    Args:
        task: one of :data:`~comlrl_lightning.tasks.cooperation.COOPERATION_TASK` (``coordination``,
            ``division``, ``dependence``; the last has 2 turns: set ``rollout.num_turns: 2``).
        num_train: training problems (distinct; default 400; at most the task's ``pool`` of the training
            categories: coordination with 4 options, 20,160).
        num_held_out: held-out problems (distinct; default 50), the same for every ``seed`` (at most the
            ``pool`` of the held-out categories: coordination with 4 options, 10,080).
        num_options: options (words) per problem, in [2, 8]; None: the task's default (4; division 3).
        problem_seed: seed of the problems (training: ``problem_seed``, held-out: ``problem_seed + 1``);
            ``seed`` (a :class:`DecPOMDPDataModule` argument) only orders the training batches.
        formatters: the two agents' turn-0 prompt templates; None: the task's.
        **kwargs: :class:`DecPOMDPDataModule` arguments (batch_size, val_batch_size, seed, ...).

    Raises:
        ValueError: an unknown ``task``, ``num_train`` / ``num_held_out`` < 1 or above the distinct
            problems the split's word banks give (``pool``: held-out coordination, 4 options: 10,080),
            ``num_options`` out of [2, 8], or formatters that are not two; each naming the ``data.`` field.
    """

    def __init__(
        self,
        task: CooperationTaskName = "coordination",
        num_train: int = 400,
        num_held_out: int = 50,
        num_options: int | None = None,
        problem_seed: int = 0,
        formatters: Sequence[str | Formatter] | None = None,
        **kwargs: Any,
    ) -> None:
        try:
            COOPERATION_TASK.check(task)
        except ValueError as err:
            raise ValueError(f"data.{err}") from None
        spec = TASKS[task]
        for name, n in (("num_train", num_train), ("num_held_out", num_held_out)):
            if not isinstance(n, int) or n < 1:
                raise ValueError(f"data.{name}: got {n!r}, must be an integer >= 1")
        num_options = spec.num_options if num_options is None else num_options
        if not isinstance(num_options, int) or not 2 <= num_options <= 8:
            raise ValueError(f"data.num_options: got {num_options!r}, must be an integer in [2, 8]")
        for name, n, split in (("num_train", num_train, "train"), ("num_held_out", num_held_out, "held_out")):
            # checked here, not left to the draw: asking for more distinct problems than exist kept the
            # draw looping (100,000 of 10,080 held-out problems: minutes at full CPU, no output)
            pool = spec.pool(split, num_options)
            if n > pool:
                raise ValueError(
                    f"data.{name}: got {n}, but the {split.replace('_', '-')} word banks give only {pool:,} distinct "
                    f"{task!r} problems with {num_options} options; set data.{name} to at most {pool}"
                )
        formatters = spec.formatters if formatters is None else formatters
        if len(formatters) != 2:
            raise ValueError(f"data.formatters: got {len(formatters)}, the cooperation tasks have 2 agents")
        super().__init__(
            formatters=formatters,
            reward=spec.reward(),
            transition=spec.transition() if spec.transition else None,
            num_agents=2,
            **kwargs,
        )
        self.task, self.num_turns = task, spec.num_turns
        self.num_train, self.num_held_out = num_train, num_held_out
        self.num_options, self.problem_seed = num_options, problem_seed

    def load_train_val(self) -> tuple[Any, Any]:
        rows = TASKS[self.task].rows
        train = rows(self.num_train, self.problem_seed, "train", self.num_options)
        return train, rows(self.num_held_out, self.problem_seed + 1, "held_out", self.num_options)

    def setup(self, stage: str) -> None:
        """Also refuses a module whose ``rollout.num_turns`` is not the task's (a dependence episode
        cut at turn 0 would score 0 for every joint action).

        Raises:
            ValueError: naming ``model.rollout.num_turns``, its value and the task's.
        """
        module = self.trainer.lightning_module if self.trainer is not None else None
        turns = getattr(getattr(module, "rollout_config", None), "num_turns", self.num_turns)
        if turns != self.num_turns:
            raise ValueError(
                f"model.rollout.num_turns: got {turns}, the {self.task!r} task has {self.num_turns} turn(s)"
            )
        super().setup(stage)
