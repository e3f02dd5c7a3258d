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
    updated once per batch, after the agents. See :class:`ActorCritic` for the arguments."""

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
