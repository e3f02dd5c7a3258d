"""One optimizer (and LR scheduler) per agent under manual optimisation: building them, stepping an
agent (non-finite check, clip, step, scheduler), and counting steps against ``trainer.max_steps``.

:class:`AgentOptimization` is the parent of :class:`~comlrl_lightning.algorithms.base.CoMLRLModule`,
which provides what it reads: ``specs``, ``team``, ``num_agents``, ``optimizer_factory``,
``scheduler_factory``, ``learning_rate``, ``skipped_steps`` and ``fabric_schedulers``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.core.optimizer import LightningOptimizer
from lightning.pytorch.utilities import rank_zero_warn

from comlrl_lightning.core import metrics as M
from comlrl_lightning.core.config import LossConfig
from comlrl_lightning.core.nonfinite import gradients_finite, nonfinite_verdict
from comlrl_lightning.team.team import BACKWARD_LOCK


@dataclass(frozen=True)
class SkipCounter:
    """Whose optimizer step is checked, and where its skipped steps are counted.

    Attributes:
        who: how messages name the owner (``"agent 1"``, ``"critic 0"``).
        counts: the counter list (saved in checkpoints); ``counts[slot]`` is the owner's.
        slot: the owner's index in ``counts``.
        metric: the logged name of ``counts[slot]``.
    """

    who: str
    counts: list[int]
    slot: int
    metric: str


class AgentOptimization(pl.LightningModule):
    """Manual optimisation with one optimizer (and optional scheduler) per agent (module docstring)."""

    def configure_optimizers(self) -> list[dict[str, Any]]:
        out = []
        for i, spec in enumerate(self.specs):
            params = self.team.trainable_parameters(i)  # what the agent trains: its kind decides
            opt = (
                self.optimizer_factory(params)
                if self.optimizer_factory is not None
                else torch.optim.AdamW(params, lr=self.learning_rate)
            )
            if spec.learning_rate is not None:
                for group in opt.param_groups:
                    group["lr"] = spec.learning_rate
                    group["initial_lr"] = spec.learning_rate
            entry: dict[str, Any] = {"optimizer": opt}
            if self.scheduler_factory is not None:
                entry["lr_scheduler"] = {"scheduler": self.scheduler_factory(opt), "name": f"lr/agent_{i}"}
            out.append(entry)
        return out

    def agent_optimizers(self) -> tuple[list[Any], list[Any]]:
        """``(optimizers, schedulers)``, one of each per agent (scheduler None when there is none).

        Under Lightning Fabric (the coordinator's learners) Lightning keeps no scheduler configs, so
        the schedulers are the ones the driver put in :attr:`fabric_schedulers`.
        """
        opts = self.optimizers()
        opts = opts if isinstance(opts, list) else [opts]
        if self.fabric is not None:
            return opts, list(self.fabric_schedulers or [None] * self.num_agents)
        schs = self.lr_schedulers()
        schs = (schs if isinstance(schs, list) else [schs]) if schs is not None else [None] * self.num_agents
        return opts, schs

    def _batch_position(self) -> str:
        """Where training is, for messages: epoch and batch under a Trainer, else the global step."""
        if self._trainer is None:
            return f"global_step={self.global_step}"
        loop = self.trainer.fit_loop
        return (
            f"epoch {self.current_epoch}, batch {loop.epoch_loop.batch_idx}, global_step={self.global_step}"
        )

    def step_agent(self, agent: int, loss: float | None, cfg: LossConfig) -> bool:
        """Clip at ``cfg.max_grad_norm``, ``optimizer.step()`` (counted by Lightning) and scheduler step;
        main thread only, so ``global_step`` grows by one per agent step in agent order.

        First the agent's ``loss`` and gradients are checked (:meth:`finite_or_skip`): if any is
        NaN/inf, ``cfg.on_nonfinite`` either skips the step (gradients dropped, counted in
        :attr:`skipped_steps` and logged as ``z_agent_<i>/skipped_steps``; the step still counts in
        ``global_step``, so the cadence is unchanged) or raises.

        Returns:
            Whether the optimizer stepped.

        Raises:
            FloatingPointError: non-finite loss or gradients with ``on_nonfinite="stop"``.
        """
        opts, schs = self.agent_optimizers()
        counter = SkipCounter(f"agent {agent}", self.skipped_steps, agent, M.agent(agent, "skipped_steps"))
        if not self.finite_or_skip(opts[agent], loss, cfg.on_nonfinite, counter):
            return False
        if cfg.max_grad_norm is not None:
            self.clip_gradients(
                opts[agent], gradient_clip_val=cfg.max_grad_norm, gradient_clip_algorithm="norm"
            )
        opts[agent].step()
        # free this agent's gradients now, not at its next zero_grad: otherwise every other agent's
        # backward runs while they still hold memory (one parameter-sized buffer per agent)
        opts[agent].zero_grad(set_to_none=True)
        if schs[agent] is not None:
            schs[agent].step()
        return True

    def finite_or_skip(
        self, optimizer: torch.optim.Optimizer, loss: float | None, on_nonfinite: str, counter: SkipCounter
    ) -> bool:
        """Whether ``loss`` and the gradients of ``optimizer``'s parameters are all finite; if not,
        skip (drop the gradients, count one in ``counter``, warn) or raise. Logs the count as
        ``counter.metric``.

        Args:
            optimizer: the optimizer about to step.
            loss: the loss that made the gradients (None: not checked).
            on_nonfinite: :attr:`LossConfig.on_nonfinite`.
            counter: whose step it is and where its skips are counted (saved in checkpoints).

        Raises:
            FloatingPointError: non-finite values with ``on_nonfinite="stop"``, naming the owner and the batch.
        """
        finite, grad_norm = gradients_finite(optimizer, loss)
        if self._trainer is not None:  # one decision for every rank (a rank-local loss can differ)
            finite = bool(self.trainer.strategy.reduce_boolean_decision(finite, all=True))
        if not finite:
            where = self._batch_position()
            what = f"{counter.who}: non-finite loss ({loss}) or gradient norm ({grad_norm}) at {where}"
            warning = nonfinite_verdict(what, on_nonfinite)  # raises under "stop"
            counter.counts[counter.slot] += 1
            rank_zero_warn(f"{warning} ({counter.counts[counter.slot]} skipped so far)")
            optimizer.zero_grad(set_to_none=True)
            self._count_skipped_step(optimizer)
        if self._trainer is not None:
            self.log(counter.metric, float(counter.counts[counter.slot]))
        return finite

    @staticmethod
    def _count_skipped_step(optimizer: Any) -> None:
        """Count a skipped step in ``trainer.global_step`` as if the optimizer had stepped, so a skip
        shifts neither the step count, the checkpoint cadence (``every_n_train_steps``) nor where
        ``max_steps`` stops (as ``transformers.Trainer`` counts a step its grad scaler skipped). The
        LR scheduler is not stepped for it (``transformers.Trainer`` steps it only when the optimizer
        ran). Lightning counts a manual step in the hooks :class:`~lightning.pytorch.core.optimizer.
        LightningOptimizer` calls around ``step()``; they are no-ops outside a Trainer (Fabric)."""
        if isinstance(optimizer, LightningOptimizer):
            optimizer._on_before_step()
            optimizer._on_after_step()

    def locked_backward(self, loss: torch.Tensor) -> None:
        """``manual_backward`` under :data:`~comlrl_lightning.team.team.BACKWARD_LOCK` (agent threads)."""
        with BACKWARD_LOCK:
            self.manual_backward(loss)

    @staticmethod
    def max_steps_for(num_batches: int, num_agents: int, num_iterations: int = 1) -> int:
        """``trainer.max_steps`` that trains ``num_batches`` batches (Lightning counts every optimizer
        step; one batch steps each agent ``num_iterations`` times; see :meth:`LossConfig.max_steps_for`)."""
        return num_batches * num_agents * num_iterations

    @property
    def steps_per_batch(self) -> int:
        """Optimizer steps one training batch takes, i.e. how much ``trainer.global_step`` grows per
        batch: one per agent here; algorithms that step more often override it."""
        return self.num_agents

    def steps_per_batch_terms(self) -> str:
        """How :attr:`steps_per_batch` is made up, for messages."""
        return f"num_agents={self.num_agents}"

    def _check_max_steps(self) -> None:
        """Warn when ``trainer.max_steps`` is not a whole number of batches: Lightning checks it only
        between batches, so the last batch runs all its steps and ``global_step`` overshoots."""
        max_steps, per = self.trainer.max_steps, self.steps_per_batch
        if max_steps > 0 and max_steps % per:
            batches = -(-max_steps // per)
            whole = " or ".join(str(n) for n in ((max_steps // per) * per, batches * per) if n > 0)
            rank_zero_warn(
                f"max_steps={max_steps} is not a multiple of the {per} optimizer steps one batch takes "
                f"({self.steps_per_batch_terms()}): training runs {batches} batches and stops at "
                f"global_step={batches * per}; set max_steps={whole} (max_steps_for converts batches "
                "to steps)"
            )
