"""MAGRPO: multi-agent group-relative policy optimisation as a LightningModule.

Features:
    - N ≥ 1 agents (``num_agents=1`` is GRPO), each its own model and tokenizer, in an ``nn.ModuleList``;
    - manual optimisation, one optimizer (and optional LR scheduler) per agent, per-agent clipping;
    - one batched ``generate`` per agent per turn over episodes × K, through the ``actors`` seam
      (the team by default; a subclass changes who generates what: ``core/rollout.Actors``);
    - joint actions per node (``joint_mode``: :data:`~comlrl_lightning.core.advantages.JOINT_MODE`);
    - tree rollouts over ``num_turns`` with ``discount``, ``stop_reward`` and CoMLRL's
      ``termination_threshold`` (see core/rollout.py);
    - group-baseline advantages (``advantage_mode``: :data:`~comlrl_lightning.core.advantages.ADVANTAGE_MODE`);
    - log-probs from ``logits / temperature``, EOS counted, padding masked, ``logits_to_keep``;
    - per-agent ``credit`` under the shared reward (:data:`~comlrl_lightning.core.credit.CREDIT`);
    - ``scale_rewards`` (:data:`~comlrl_lightning.core.advantages.SCALE_REWARDS`), agent-wise (Dr. MAS)
      or team statistics;
    - TRL's ``loss_type`` (:data:`~comlrl_lightning.core.loss.LOSS_TYPE`), GSPO's sequence ratio
      (``importance_sampling_level``), ``epsilon_high``, ``delta``, ``mask_truncated_completions``;
    - ``entropy`` per agent (logged, from the loss's own forward);
    - ``num_iterations > 1``: PPO-style clipped ratio against log-probs from before the update;
    - ``beta > 0``: k3 KL to a frozen reference copy of each agent, as a loss term or, with
      ``kl_mode="reward"``, subtracted from each sample's return before the baseline (CoMLRL).

Aliases ``MAREINFORCE``, ``MARLOO``, ``MAReMax`` fill in their ``advantage_mode`` when it is unset
and refuse a different explicit one. Not supported: value functions (see IAC/MAAC), vLLM generation.

Step counting: Lightning counts every ``optimizer.step()`` in ``trainer.global_step``. One training
batch steps each of the N agents ``num_iterations`` times, so ``global_step`` grows by
``N · num_iterations`` per batch: ``Trainer(max_steps=S)`` trains ``S / (N · num_iterations)``
batches. Loggers' x-axis counts batches. :meth:`LossConfig.max_steps_for` converts.
"""

from __future__ import annotations

import inspect
import time
from functools import partial
from typing import Any, ClassVar

import torch

from comlrl_lightning.algorithms.base import CoMLRLModule
from comlrl_lightning.core import metrics as M
from comlrl_lightning.core.config import (
    DEFAULTS,
    AdvantageConfig,
    LossConfig,
    PlacementConfig,
    RolloutConfig,
    SamplingConfig,
)
from comlrl_lightning.core.deprecations import group_flat_kwargs
from comlrl_lightning.core.records import AgentStats, StepOutput, Turn
from comlrl_lightning.core.rollout import RolloutPlan, compute_advantages
from comlrl_lightning.core.update import AgentBatch, agent_backward, prepare_agent_batch, sequence_kls
from comlrl_lightning.envs.base import Episode
from comlrl_lightning.team.agents import AgentSpec, normalize_agents

_BASE_ARGUMENTS = frozenset(inspect.signature(CoMLRLModule.__init__).parameters) - {"self", "specs", "groups"}
"""The keyword arguments MAGRPO forwards to :class:`CoMLRLModule` (the rest of ``**kwargs`` is flat config)."""


class MAGRPO(CoMLRLModule):
    """Multi-agent GRPO over a Dec-POMDP with a shared reward (Liu et al. 2025, arXiv 2508.04652).

    Args:
        agents: one :class:`AgentSpec` (or model string) per agent, or one broadcast to ``num_agents``.
        num_agents: number of agents; default ``len(agents)``.
        rollout: tree rollout knobs (:class:`RolloutConfig`: ``num_generations``, ``num_turns``, ...).
        advantage: baselines (:class:`AdvantageConfig`: ``advantage_mode``, ``scale_rewards``, ...).
        loss: the per-agent update (:class:`LossConfig`: ``loss_type``, ``num_iterations``, ``beta``, ...).
        sampling: sampling (:class:`SamplingConfig`; ``AgentSpec.generation`` overrides per agent).
        placement: devices (:class:`PlacementConfig`: ``parallel_training``, ``agent_devices``).
        **kwargs: :class:`CoMLRLModule`'s (``optimizer``, ``scheduler``, ``learning_rate``,
            ``val_sampling``, ``env``); any other key is the pre-grouping spelling
            (``num_generations=2``, ``scale_advantages=...``), routed to its group with a
            DeprecationWarning (see :func:`group_flat_kwargs`).

    Concurrency: when the agents live on two or more devices and one of them is a GPU, rollout
    generation and the per-agent forward/backward run in one thread per device (:meth:`Team.map`);
    optimizer steps stay in the main thread, in agent order. ``concurrent_agents`` forces it.

    Raises:
        ValueError: a bad config value, naming the field, before any model is loaded.
        TypeError: an unknown keyword argument.
    """

    alias_advantage_mode: ClassVar[str | None] = None
    """An alias's baseline (``MARLOO``: ``rloo``): filled in when ``advantage_mode`` is unset, a
    different explicit value refused. None (MAGRPO): ``mean`` when unset, any explicit value kept."""

    def __init__(
        self,
        agents: list[AgentSpec] | AgentSpec | list[str] | str,
        num_agents: int | None = None,
        rollout: RolloutConfig = DEFAULTS["rollout"],
        advantage: AdvantageConfig = DEFAULTS["advantage"],
        loss: LossConfig = DEFAULTS["loss"],
        sampling: SamplingConfig = DEFAULTS["sampling"],
        placement: PlacementConfig = DEFAULTS["placement"],
        **kwargs: Any,
    ) -> None:
        flat = {k: kwargs.pop(k) for k in list(kwargs) if k not in _BASE_ARGUMENTS}
        groups = group_flat_kwargs(
            flat,
            dict(rollout=rollout, advantage=advantage, loss=loss, sampling=sampling, placement=placement),
        )
        alias = None if self.alias_advantage_mode is None else type(self).__name__
        groups["advantage"] = groups["advantage"].with_mode(self.alias_advantage_mode or "mean", alias)
        super().__init__(normalize_agents(agents, num_agents), groups, **kwargs)
        self.advantage: AdvantageConfig = groups["advantage"]
        self.loss: LossConfig = groups["loss"]
        self.save_config(groups, ignore=[])

    @property
    def uses_reference_model(self) -> bool:
        return self.loss.beta > 0

    @property
    def num_turns(self) -> int:
        return self.rollout_config.num_turns

    @property
    def steps_per_batch(self) -> int:
        return self.num_agents * self.loss.num_iterations

    def steps_per_batch_terms(self) -> str:
        return f"num_agents={self.num_agents} × num_iterations={self.loss.num_iterations}"

    def setup(self, stage: str) -> None:
        super().setup(stage)
        if self.num_turns > 1 and self.env.transition_fn is None:
            raise ValueError(f"num_turns={self.num_turns} needs an env transition (data.transition)")

    # ------------------------------------------------------------------ the step, top to bottom
    def training_step(self, batch: list[Episode], batch_idx: int) -> StepOutput:
        t0 = time.perf_counter()
        turns = self.rollout(batch)  # observe → generate → join → reward → transition; returns; advantages
        t_rollout = time.perf_counter() - t0
        stats = self.update_agents(turns)  # one update per agent
        out = StepOutput.from_turns(turns, stats, self.rollout_config.num_generations)
        out.rollout_time_s, out.step_time_s = t_rollout, time.perf_counter() - t0
        self.log_step(out)
        return out

    def score_turns(self, turns: list[Turn], plan: RolloutPlan, evaluation: bool) -> None:
        """Group-baseline advantages of every sample (``kl_mode="reward"``: minus its ``β·KL`` cost)."""
        costs = None
        if self.uses_reference_model and self.loss.kl_mode == "reward" and not evaluation:
            costs = self._kl_costs(turns)
        compute_advantages(turns, plan, self.advantage, self.num_agents, costs)

    def _kl_costs(self, turns: list[Turn]) -> list[list[torch.Tensor]]:
        """``kl_mode="reward"``: per turn, per agent ``[G, K]`` ``β·KL`` of each sample to the reference."""
        kls = self.team.map(
            lambda i: sequence_kls(
                self.agents[i], self.team.reference(i), turns, i, self.team.sampling[i].temperature
            ),
            range(self.num_agents),
        )
        return [[self.loss.beta * kls[i][t] for i in range(self.num_agents)] for t in range(len(turns))]

    def update_agents(self, turns: list[Turn]) -> list[AgentStats]:
        """``num_iterations`` × (zero_grad, forward/backward, clip, step) for every agent.

        Agents go in :meth:`Team.rounds`: serially one per round, or one per device group per round
        when threaded. The no-grad pass (old / reference log-probs) and forward/backward run in
        :meth:`Team.map`; optimizer steps run here, in agent order. Every agent's no-grad pass runs
        before any step: agents that share weights would otherwise take their old log-probs from a
        policy another agent already updated, not the one that sampled the batch.
        """
        stats: list[AgentStats] = [AgentStats()] * self.num_agents
        batches: dict[int, AgentBatch] = {}
        for agents in self.team.rounds():
            batches.update(zip(agents, self.team.map(partial(self._prepare, turns=turns), agents)))
        for agents in self.team.rounds():
            for _ in range(self.loss.num_iterations):
                for i, s in zip(agents, self.team.map(partial(self._backward, batches=batches), agents)):
                    self.step_agent(i, s.loss, self.loss)
                    stats[i] = s
        return stats

    def _prepare(self, agent: int, turns: list[Turn]) -> AgentBatch:
        ref = self.team.reference(agent) if self.uses_reference_model else None
        return prepare_agent_batch(
            self.agents[agent], ref, turns, agent, self.team.sampling[agent], self.loss
        )

    def _backward(self, agent: int, batches: dict[int, AgentBatch]) -> AgentStats:
        opts, _ = self.agent_optimizers()
        opts[agent].zero_grad()
        return agent_backward(self.agents[agent], batches[agent], self.loss, self.locked_backward)

    def log_step(self, out: StepOutput) -> None:
        """The module's own scalars (the rest is :class:`~comlrl_lightning.callbacks.RewardLogger`'s)."""
        # sync_dist: under DDP every rank saw other episodes; the logged value is the mean over ranks
        # (a no-op in one process). Values go to self.device first: NCCL cannot reduce CPU tensors.
        dev, n = self.device, out.num_episodes
        self.log(M.REWARD, out.rewards.mean().to(dev), prog_bar=True, batch_size=n, sync_dist=True)
        self.log(M.REWARD_STD, out.reward_std.to(dev), batch_size=n, sync_dist=True)
        self.log(M.FRAC_REWARD_ZERO_STD, out.frac_reward_zero_std.to(dev), batch_size=n, sync_dist=True)
        lengths = torch.cat(out.completion_lengths).float()
        self.log(M.MEAN_LENGTH, lengths.mean().to(dev), batch_size=n, sync_dist=True)
        for i, s in enumerate(out.agent_stats):
            self.log(M.agent(i, "loss"), s.loss, batch_size=n, sync_dist=True)
            self.log(M.agent(i, "entropy"), s.entropy, batch_size=n, sync_dist=True)
        gaps = [(i, s.engine_gap) for i, s in enumerate(out.agent_stats) if s.engine_gap is not None]
        for i, gap in gaps:  # engine rollouts: how far the sampler's log-probs are from the trainer's
            self.log(M.agent(i, M.SAMPLING_LOGP_DIFFERENCE_MEAN), gap.mean, batch_size=n)
            self.log(M.agent(i, M.SAMPLING_LOGP_DIFFERENCE_MAX), gap.abs_max, batch_size=n)
        if gaps:
            self.log(M.SAMPLING_LOGP_DIFFERENCE_MEAN, sum(g.mean for _, g in gaps) / len(gaps), batch_size=n)
            self.log(M.SAMPLING_LOGP_DIFFERENCE_MAX, max(g.abs_max for _, g in gaps), batch_size=n)


class MAREINFORCE(MAGRPO):
    """MAGRPO with ``advantage_mode="raw"`` (no baseline; CoMLRL's MAREINFORCE)."""

    alias_advantage_mode = "raw"


class MARLOO(MAGRPO):
    """MAGRPO with ``advantage_mode="rloo"`` (leave-one-out baseline; CoMLRL's MARLOO)."""

    alias_advantage_mode = "rloo"


class MAReMax(MAGRPO):
    """MAGRPO with ``advantage_mode="max"`` (max baseline; CoMLRL's MAReMax)."""

    alias_advantage_mode = "max"
