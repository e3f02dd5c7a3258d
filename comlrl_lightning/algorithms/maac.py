"""MAAC: multi-agent actor-critic with one centralised critic (CoMLRL ``actor_critic/maac.py``; see
:mod:`comlrl_lightning.algorithms.actor_critic` for what IAC and MAAC share)."""

from __future__ import annotations

import torch

from comlrl_lightning.algorithms.actor_critic import ActorCritic, CriticBatch
from comlrl_lightning.core.advantages import agent_sample_returns, joint_action_indices
from comlrl_lightning.core.generation import render_prompt
from comlrl_lightning.core.records import Turn
from comlrl_lightning.core.td import (
    absorbing_rewards,
    critic_baseline,
    normalize_advantages,
    td_advantages,
    td_targets,
)
from comlrl_lightning.team.critics import central_observation


class MAAC(ActorCritic):
    """Multi-agent actor-critic with one centralised critic reading every agent's observation (and the
    joint action for Q); every agent gets the same TD error (CoMLRL ``MAACTrainer``). The critic is
    updated once per batch, after the agents. See :class:`ActorCritic` for the arguments.

    Where this differs from CoMLRL 1.4.3's ``MAACTrainer`` (decided, not accidental):

    - **Critic steps.** CoMLRL steps the critic once per agent (``_ac_step``: after each agent's
      actor step, on that agent's samples), so N critic steps per batch on the same shared targets;
      here one step per batch on the team's target (the mean of the agents' targets; with a shared
      reward every agent's). One step per batch keeps ``global_step = N · num_iterations + 1`` and
      the critic's update independent of the agent order; CoMLRL's rhythm is about N steps at
      ``critic_learning_rate`` where this takes one.
    - **Value clipping.** CoMLRL's MAAC never clips the critic's value loss; here
      ``critic.value_clip_range`` (default 0.2) applies: set it None for CoMLRL's loss
      (:class:`~comlrl_lightning.team.critics.CriticConfig`).
    - **Multi-turn input.** CoMLRL's critic reads each agent's *current* turn prompt; here it reads
      each agent's whole history (earlier prompts and its own completions), the observation the
      actors condition on: at turn t > 0 a critic of the current prompt alone cannot tell apart
      histories that lead to the same prompt. Single-turn the two texts are the same.
    - **Critic text** (:func:`~comlrl_lightning.team.critics.central_observation`) is CoMLRL's
      character for character."""

    centralised = True

    def _joint(self, turn: Turn) -> torch.Tensor:
        return joint_action_indices(
            self.num_agents, self.rollout_config.num_generations, self.rollout_config.joint_mode
        )

    def critic_values(self, critic: int, turn: Turn) -> torch.Tensor:
        """``[G·J]`` (row ``g·J + j``): ``V`` of node g (repeated over its joint actions) or ``Q`` of joint action j."""
        n, k, joint = self.num_agents, self.rollout_config.num_generations, self._joint(turn)
        obs = [
            [render_prompt(None, node.prompts[i], node.completions[i], False) for i in range(n)]
            for node in turn.nodes
        ]
        if self.critic_config.critic_type == "v":
            return self._read(0, [central_observation(o)[0] for o in obs], None).repeat_interleave(
                joint.shape[0]
            )
        prompts, actions = [], []
        for g, o in enumerate(obs):
            for j in range(joint.shape[0]):
                acts = [turn.generations[i].texts[g * k + int(joint[j, i])] for i in range(n)]
                p, a = central_observation(o, acts)
                prompts.append(p)
                actions.append(a)
        return self._read(0, prompts, actions)

    @torch.no_grad()
    def estimate(self, turns: list[Turn]) -> list[CriticBatch]:
        cfg, n, k = self.rollout_config, self.num_agents, self.rollout_config.num_generations
        values = [self.critic_values(0, t).float().cpu() for t in turns]
        targets = []
        for s, t in enumerate(turns):
            joint = self._joint(t)
            g, j = len(t.nodes), joint.shape[0]
            nxt = values[s + 1].view(-1, j) if s + 1 < len(turns) else None
            base = critic_baseline(values[s].view(g, j), self.critic_config.critic_type)
            per_agent = [t.rewards[..., i] if t.rewards.dim() == 3 else t.rewards for i in range(n)]
            per_agent = [
                absorbing_rewards(r, self.solved_mask(t), t.turns_left, cfg.discount) for r in per_agent
            ]
            joint_t = [td_targets(r, t.child, nxt, cfg.discount) for r in per_agent]  # per agent [G, J]
            t.agent_returns, t.advantages = [], []
            for i in range(n):
                adv = agent_sample_returns(td_advantages(joint_t[i], base), joint, i, k)  # [G, K]
                if self.critic_config.advantage_normalization:
                    adv = normalize_advantages(adv)
                t.agent_returns.append(agent_sample_returns(joint_t[i], joint, i, k).flatten())
                t.advantages.append(adv.flatten())
            targets.append(
                torch.stack(joint_t).mean(0).flatten()
            )  # the team's target (shared rewards: every agent's)
        return [CriticBatch(values, targets)]
