"""IAC: independent actor-critic, one critic per agent (CoMLRL ``actor_critic/iac.py``; see
:mod:`comlrl_lightning.algorithms.actor_critic` for what IAC and MAAC share)."""

from __future__ import annotations

import torch

from comlrl_lightning.algorithms.actor_critic import ActorCritic, CriticBatch
from comlrl_lightning.core.advantages import agent_sample_returns, joint_action_indices
from comlrl_lightning.core.records import Turn
from comlrl_lightning.core.td import absorbing_rewards, critic_baseline, td_advantages, td_targets
from comlrl_lightning.core.value_head import read_positions, trunk_of, values_at


class IAC(ActorCritic):
    """Independent actor-critic: agent ``i``'s critic reads agent ``i``'s history (and completion for Q)
    and gives agent ``i``'s TD targets (CoMLRL ``IACTrainer``). See :class:`ActorCritic` for the arguments."""

    def critic_values(self, critic: int, turn: Turn) -> torch.Tensor:
        gen, k = turn.generations[critic], self.rollout_config.num_generations
        typ, spec = self.critic_config.critic_type, self.critic_specs[critic]
        if typ == "v":  # one read per node: its K rows share the prompt
            if not spec.separate:
                idx = torch.arange(0, len(gen.texts), k)
                g = gen.rows(idx)
                pos = torch.full((len(idx),), g.prompt_ids.shape[1] - 1)
                v = values_at(
                    trunk_of(self.agents[critic]), self.critics[critic], g.prompt_ids, g.prompt_mask, pos
                )
            else:
                v = self._read(critic, list(turn.prompt_texts[critic]), None)
            return v.repeat_interleave(k)
        if not spec.separate:
            ids = torch.cat([gen.prompt_ids, gen.completion_ids], 1)
            mask = torch.cat([gen.prompt_mask, gen.completion_mask], 1)
            pos = read_positions(gen.prompt_mask, gen.completion_mask, "q")
            return values_at(trunk_of(self.agents[critic]), self.critics[critic], ids, mask, pos)
        prompts = [p for p in turn.prompt_texts[critic] for _ in range(k)]
        return self._read(critic, prompts, list(gen.texts))

    @torch.no_grad()
    def estimate(self, turns: list[Turn]) -> list[CriticBatch]:
        cfg, n, k = self.rollout_config, self.num_agents, self.rollout_config.num_generations
        joint_index = joint_action_indices(n, k, cfg.joint_mode)
        for t in turns:
            t.agent_returns, t.advantages = [torch.empty(0)] * n, [torch.empty(0)] * n
        out = []
        for i in range(n):
            values = [self.critic_values(i, t).float().cpu() for t in turns]
            targets = []
            for s, t in enumerate(turns):
                g = len(t.nodes)
                nxt = values[s + 1].view(-1, k) if s + 1 < len(turns) else None
                rewards = t.rewards[..., i] if t.rewards.dim() == 3 else t.rewards
                rewards = absorbing_rewards(rewards, self.solved_mask(t), t.turns_left, cfg.discount)
                joint_t = td_targets(rewards, t.child, nxt, cfg.discount)  # [G, J]
                sample_t = agent_sample_returns(joint_t, joint_index, i, k)  # [G, K]
                base = critic_baseline(values[s].view(g, k), self.critic_config.critic_type)
                adv = td_advantages(sample_t, base, self.critic_config.advantage_normalization)
                t.agent_returns[i], t.advantages[i] = sample_t.flatten(), adv.flatten()
                targets.append(sample_t.flatten())
            out.append(CriticBatch(values, targets))
        return out
