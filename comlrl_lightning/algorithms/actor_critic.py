"""What IAC and MAAC share (iac.py, maac.py): actor-critic for a cooperative team of LLM agents
(CoMLRL ``actor_critic/ac_base.py``).

Features:
    - ``IAC``: one critic per agent, reading that agent's history (V) or history and completion (Q);
      each critic a separate model with its own tokenizer (``critics[i].model``), or a value head on
      the agent's trunk (``model: null``), trained with the actor in one joint loss;
    - ``MAAC``: one centralised critic reading every agent's observation (and the joint action for
      Q), rendered by :func:`~comlrl_lightning.team.critics.central_observation` with the critic's
      own tokenizer; one shared TD error for every agent;
    - TD targets over turns ``T_t = r_t + discount · mean(V(h_{t+1}))`` (see core/td.py), advantages
      ``T − V`` (Q: minus the sibling mean of Q), optionally normalised per agent and turn;
    - per-agent rewards (``[J, N]``) where the reward gives them;
    - value loss ``value_loss_coef · (V − T)²``, clipped at ``value_clip_range`` against the values
      from before the update, on every critic (CoMLRL clips only a head on the actor: ``CriticConfig``);
    - one optimizer per agent (the base class's) plus one per separate critic (``critic_learning_rate``,
      or ``critics[i].learning_rate``); a head on the trunk is a parameter group of its agent's
      optimizer with its own learning rate; per-agent and per-critic gradient-norm clipping;
    - the rollout tree, policy loss, KL to a reference and placement of MAGRPO (the shared base class).

Not supported: learning-rate schedulers for critics, PPO epochs over the critic.

Step counting: Lightning counts every ``optimizer.step()``. One batch steps each agent
``num_iterations`` times and each *separate* critic once (a head on the trunk steps with its agent),
so ``global_step`` grows by ``N · num_iterations + C`` per batch (``C`` separate critics: ``N`` or 0
for IAC, 1 for MAAC). :meth:`ActorCritic.max_steps_for` converts.
"""

from __future__ import annotations

import time
from dataclasses import asdict, replace
from functools import partial
from typing import Any, ClassVar

import torch
from torch import nn

from comlrl_lightning.algorithms.base import CoMLRLModule
from comlrl_lightning.algorithms.optimization import SkipCounter
from comlrl_lightning.core import metrics as M
from comlrl_lightning.core.config import LossConfig, PlacementConfig, SamplingConfig
from comlrl_lightning.core.records import AgentStats, StepOutput, Turn
from comlrl_lightning.core.td import (
    explained_variance,
    value_loss,
)
from comlrl_lightning.core.update import agent_backward, prepare_agent_batch
from comlrl_lightning.core.value_head import ValueHead, hidden_size_of
from comlrl_lightning.envs.base import Episode
from comlrl_lightning.team.agents import AgentSpec, normalize_agents
from comlrl_lightning.team.critics import (
    ActorCriticRolloutConfig,
    CriticBatch,
    CriticConfig,
    CriticSpec,
    encode_critic_inputs,
    load_critic,
    normalize_critics,
)

_GROUP_TYPES = {
    "rollout": ActorCriticRolloutConfig,
    "critic": CriticConfig,
    "loss": LossConfig,
    "sampling": SamplingConfig,
    "placement": PlacementConfig,
}
"""Init-argument name -> config group (a dict from a checkpoint's hparams is rebuilt as its group)."""
_DEFAULTS = {name: cls() for name, cls in _GROUP_TYPES.items()}
"""The signature defaults (so ``--print_config`` lists every field); never mutated: ``__init__`` copies."""


class ActorCritic(CoMLRLModule):
    """Shared body of :class:`IAC` and :class:`MAAC` (see the module docstring).

    Args:
        agents: one :class:`AgentSpec` (or model string) per agent, or one broadcast to ``num_agents``.
        num_agents: number of agents; default ``len(agents)``.
        critics: :class:`CriticSpec` per critic (IAC: one per agent, or one broadcast; MAAC: one).
        critic: the critic knobs (:class:`CriticConfig`: ``critic_type``, ``value_loss_coef``, ...).
        rollout: :class:`ActorCriticRolloutConfig` (``num_generations`` >= 1, ``num_turns``, ``discount``).
        loss: the policy update (:class:`LossConfig`; ``max_grad_norm`` clips each agent).
        sampling, placement: see :class:`CoMLRLModule`.
        **kwargs: :class:`CoMLRLModule`'s ``optimizer``, ``scheduler``, ``learning_rate``,
            ``val_sampling``, ``env``.

    Raises:
        ValueError: a bad config value, naming the field, before any model is loaded.
    """

    centralised: ClassVar[bool] = False

    def __init__(
        self,
        agents: list[AgentSpec] | AgentSpec | list[str] | str,
        num_agents: int | None = None,
        critics: list[CriticSpec] | CriticSpec | None = None,
        critic: CriticConfig = _DEFAULTS["critic"],
        rollout: ActorCriticRolloutConfig = _DEFAULTS["rollout"],
        loss: LossConfig = _DEFAULTS["loss"],
        sampling: SamplingConfig = _DEFAULTS["sampling"],
        placement: PlacementConfig = _DEFAULTS["placement"],
        **kwargs: Any,
    ) -> None:
        given = dict(rollout=rollout, critic=critic, loss=loss, sampling=sampling, placement=placement)
        groups = {
            k: _GROUP_TYPES[k](**cfg) if isinstance(cfg, dict) else replace(cfg) for k, cfg in given.items()
        }
        beta = groups["loss"].beta
        if beta > 0 and groups["loss"].kl_mode == "reward":  # it would apply no KL at all
            why = f"{type(self).__name__} subtracts no KL from its TD rewards; allowed here: 'loss'"
            raise ValueError(f"kl_mode: got 'reward' with beta={beta}, but {why}")
        specs = normalize_agents(agents, num_agents)
        self.critic_specs = normalize_critics(critics, specs, self.centralised, type(self).__name__)
        super().__init__(specs, groups, **kwargs)
        self.critic_config: CriticConfig = groups["critic"]
        self.loss: LossConfig = groups["loss"]
        self.save_config(groups, ignore=["critics"])
        self.hparams["critics"] = [asdict(s) for s in self.critic_specs]
        self.critics = nn.ModuleList()
        self.critic_skipped_steps: list[int] = [0] * len(self.critic_specs)
        """Per critic, separate-critic optimizer steps skipped for non-finite values (a head on a trunk
        steps with its agent: counted in ``skipped_steps``)."""
        self.critic_tokenizers: list[Any] = []

    # ------------------------------------------------------------------ set-up
    @property
    def uses_reference_model(self) -> bool:
        return self.loss.beta > 0

    @property
    def num_turns(self) -> int:
        return self.rollout_config.num_turns

    @property
    def separate_critics(self) -> list[int]:
        """Indices of the critics with a model (and an optimizer) of their own."""
        return [c for c, s in enumerate(self.critic_specs) if s.separate]

    @property
    def steps_per_batch(self) -> int:
        return self.num_agents * self.loss.num_iterations + len(self.separate_critics)

    def steps_per_batch_terms(self) -> str:
        return (
            f"num_agents={self.num_agents} × num_iterations={self.loss.num_iterations} + "
            f"{len(self.separate_critics)} separate critics"
        )

    def setup(self, stage: str) -> None:
        super().setup(stage)
        if self.num_turns > 1 and self.env.transition_fn is None:
            raise ValueError(f"num_turns={self.num_turns} needs an env transition (data.transition)")

    def configure_model(self) -> None:
        """Load the team and the env's reward models (base class), then each critic. Idempotent."""
        super().configure_model()
        if len(self.critics):
            return
        for c, spec in enumerate(self.critic_specs):
            if spec.separate:
                model, tok = load_critic(spec)
            else:
                agent = self.agents[c]
                model, tok = ValueHead(hidden_size_of(agent), spec.value_head_hidden_dim), self.tokenizers[c]
            self.critics.append(model)
            self.critic_tokenizers.append(tok)

    def configure_optimizers(self) -> list[dict[str, Any]]:
        """The agents' optimizers (base class), a parameter group per head on a trunk in its agent's
        optimizer, then one optimizer per separate critic (``AdamW``, or the ``optimizer`` factory),
        each at its critic's learning rate."""
        out = super().configure_optimizers()
        for c, (spec, critic) in enumerate(zip(self.critic_specs, self.critics)):
            lr = spec.learning_rate or self.critic_config.critic_learning_rate
            params = [p for p in critic.parameters() if p.requires_grad]
            if not spec.separate:
                out[c]["optimizer"].add_param_group({"params": params, "lr": lr, "initial_lr": lr})
                continue
            opt = (
                self.optimizer_factory(params)
                if self.optimizer_factory is not None
                else torch.optim.AdamW(params, lr=lr)
            )
            for group in opt.param_groups:
                group["lr"] = group["initial_lr"] = lr
            out.append({"optimizer": opt})
        return out

    @staticmethod
    def max_steps_for(
        num_batches: int, num_agents: int, num_iterations: int = 1, num_critics: int = 0
    ) -> int:
        """``trainer.max_steps`` that trains ``num_batches`` batches with ``num_critics`` separate critics."""
        return num_batches * (num_agents * num_iterations + num_critics)

    # ------------------------------------------------------------------ the step, top to bottom
    def training_step(self, batch: list[Episode], batch_idx: int) -> StepOutput:
        t0 = time.perf_counter()
        turns = self.rollout(batch)  # observe → generate → join → reward → transition; returns
        critic_batches = self.estimate(turns)  # critic values, TD targets, advantages (no grad)
        t_rollout = time.perf_counter() - t0
        stats, value_losses = self.update_agents(
            turns, critic_batches
        )  # policy (+ value loss of heads on trunks)
        value_losses.update(self.update_critics(turns, critic_batches))  # separate critics
        out = StepOutput.from_turns(turns, stats, self.rollout_config.num_generations)
        out.rollout_time_s, out.step_time_s = t_rollout, time.perf_counter() - t0
        self.log_step(out, critic_batches, value_losses)
        return out

    def trained_modules(self) -> list[tuple[str, nn.Module, list[nn.Parameter]]]:
        critics = [(f"critic {c}", m, list(m.parameters())) for c, m in enumerate(self.critics)]
        return super().trained_modules() + critics

    def skip_counts(self) -> dict[str, list[int]]:
        return {**super().skip_counts(), "critics": self.critic_skipped_steps}

    def solved_mask(self, turn: Turn) -> torch.Tensor | None:
        """``turn.solved`` where ``rollout.solved_return="absorbing"`` (TD target of a solved joint
        action: its absorbing return), else None (CoMLRL: ``T = r``)."""
        return turn.solved if self.rollout_config.solved_return == "absorbing" else None

    @torch.no_grad()
    def estimate(self, turns: list[Turn]) -> list[CriticBatch]:
        """Critic values before the update, TD targets and each agent's advantages (``turn.advantages``,
        ``turn.agent_returns``: per agent ``[G·K]``, the sample's TD target)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ critic reads
    def critic_values(self, critic: int, turn: Turn) -> torch.Tensor:
        """``[R]`` values of ``critic`` on ``turn`` (gradients flow unless under no_grad); see :class:`CriticBatch`."""
        raise NotImplementedError

    def _read(self, critic: int, prompts: list[str], completions: list[str] | None) -> torch.Tensor:
        """A separate critic reads texts with its own tokenizer, ``micro_batch_size`` rows per forward."""
        typ, size = self.critic_config.critic_type, self.loss.micro_batch_size or max(len(prompts), 1)
        out = []
        for s in range(0, len(prompts), size):
            comps = None if completions is None else completions[s : s + size]
            ids, mask, pos = encode_critic_inputs(
                self.critic_tokenizers[critic],
                prompts[s : s + size],
                comps,
                self.team.sampling[0].max_prompt_length,
                typ,
            )
            out.append(self.critics[critic](ids, mask, pos))
        return torch.cat(out)

    # ------------------------------------------------------------------ updates
    def update_agents(
        self, turns: list[Turn], critic_batches: list[CriticBatch]
    ) -> tuple[list[AgentStats], dict[int, float]]:
        """Each agent: ``num_iterations`` × (zero_grad, policy forward/backward, clip, step), in the
        base class's rounds; a head on the trunk adds its value loss to the agent's first pass (one
        joint loss, one step). Returns each agent's stats and each head's value loss. Every agent's
        no-grad pass runs before any step (agents sharing weights: see ``MAGRPO.update_agents``)."""
        stats: list[AgentStats] = [AgentStats()] * self.num_agents
        value_losses: dict[int, float] = {}
        batches: dict[int, Any] = {}
        for agents in self.team.rounds():
            batches.update(zip(agents, self.team.map(partial(self._prepare, turns=turns), agents)))
        for agents in self.team.rounds():
            for it in range(self.loss.num_iterations):
                backward = partial(
                    self._backward, batches=batches, turns=turns, critic_batches=critic_batches, first=it == 0
                )
                for i, (s, v) in zip(agents, self.team.map(backward, agents)):
                    loss = s.loss if v is None else s.loss + v  # a head's value loss shares the agent's step
                    self.step_agent(i, loss, self.loss)
                    stats[i] = s
                    if v is not None:
                        value_losses[i] = v
        return stats, value_losses

    def _prepare(self, agent: int, turns: list[Turn]) -> Any:
        ref = self.team.reference(agent) if self.uses_reference_model else None
        return prepare_agent_batch(
            self.agents[agent], ref, turns, agent, self.team.sampling[agent], self.loss
        )

    def _backward(
        self,
        agent: int,
        batches: dict[int, Any],
        turns: list[Turn],
        critic_batches: list[CriticBatch],
        first: bool,
    ) -> tuple[AgentStats, float | None]:
        opts, _ = self.agent_optimizers()
        opts[agent].zero_grad()
        stats = agent_backward(self.agents[agent], batches[agent], self.loss, self.locked_backward)
        head = not self.centralised and not self.critic_specs[agent].separate
        return stats, (self._value_backward(agent, turns, critic_batches[agent]) if head and first else None)

    def _value_backward(self, critic: int, turns: list[Turn], data: CriticBatch) -> float:
        """Backward of ``value_loss_coef · (V − T)²`` (clipped) over every turn; returns the loss.

        A non-finite loss is backpropagated like a finite one (every rank makes the same backward
        calls, so DDP's gradient all-reduce stays in step); the step it belongs to then finds
        non-finite values and skips or stops (:meth:`finite_or_skip`, ``LossConfig.on_nonfinite``).
        """
        cfg, total = self.critic_config, sum(v.numel() for v in data.values)
        loss_sum = 0.0
        for t, old, target in zip(turns, data.values, data.targets):
            values = self.critic_values(critic, t)
            loss = value_loss(values, target, old, cfg.value_clip_range, cfg.value_loss_coef) * (
                values.numel() / total
            )
            self.locked_backward(loss)
            loss_sum += float(loss.detach())
        return loss_sum

    def update_critics(self, turns: list[Turn], critic_batches: list[CriticBatch]) -> dict[int, float]:
        """One step per separate critic (zero_grad, value backward, check for non-finite values as the
        agents' (:meth:`finite_or_skip`), clip at ``critic_max_grad_norm``, step)."""
        opts, _ = self.agent_optimizers()
        losses = {}
        for k, c in enumerate(self.separate_critics):
            opt = opts[self.num_agents + k]
            opt.zero_grad()
            losses[c] = self._value_backward(c, turns, critic_batches[c])
            counter = SkipCounter(f"critic {c}", self.critic_skipped_steps, c, M.critic(c, "skipped_steps"))
            if not self.finite_or_skip(opt, losses[c], self.loss.on_nonfinite, counter):
                continue
            if self.critic_config.critic_max_grad_norm is not None:
                self.clip_gradients(
                    opt,
                    gradient_clip_val=self.critic_config.critic_max_grad_norm,
                    gradient_clip_algorithm="norm",
                )
            opt.step()
        return losses

    # ------------------------------------------------------------------ report
    def log_step(
        self, out: StepOutput, critic_batches: list[CriticBatch], value_losses: dict[int, float]
    ) -> None:
        """MAGRPO's scalars (``z_agent_<i>/loss``, ``z_agent_<i>/entropy``, ...) plus ``critic/value_mean``,
        ``critic/value_loss``, ``critic/explained_variance`` (mean over critics) and, with several critics, ``critic/agent_<i>/<name>`` (names: core/metrics.py)."""
        dev, n = self.device, out.num_episodes
        self.log(M.REWARD, out.rewards.mean().to(dev), prog_bar=True, batch_size=n, sync_dist=True)
        self.log(M.REWARD_STD, out.reward_std.to(dev), batch_size=n, sync_dist=True)
        self.log(
            M.MEAN_LENGTH,
            torch.cat(out.completion_lengths).float().mean().to(dev),
            batch_size=n,
            sync_dist=True,
        )
        for i, s in enumerate(out.agent_stats):
            self.log(M.agent(i, "loss"), s.loss, batch_size=n, sync_dist=True)
            self.log(M.agent(i, "entropy"), s.entropy, batch_size=n, sync_dist=True)
        names = (M.CRITIC_VALUE_MEAN, M.CRITIC_VALUE_LOSS, M.CRITIC_EXPLAINED_VARIANCE)
        rows = []
        for c, data in enumerate(critic_batches):
            values, targets = torch.cat(data.values), torch.cat(data.targets)
            rows.append((float(values.mean()), value_losses.get(c, 0.0), explained_variance(values, targets)))
            for name, v in zip(names, rows[-1]) if len(critic_batches) > 1 else ():
                self.log(M.critic(c, name), v, batch_size=n, sync_dist=True)
        for name, vs in zip(names, zip(*rows)):
            self.log(name, sum(vs) / len(vs), batch_size=n, sync_dist=True)
