"""The token ids of preference pairs, per agent, and their sequence log-probs (what MADPO's loss reads).

A :class:`~comlrl_lightning.preference.selection.PairSet` keeps the rollout it came from; :func:`pair_tokens`
cuts each pair's rows out of it (the sampled ids, never re-tokenised text), :func:`agent_pair_logps`
scores them with one forward per micro-batch: rows ``[chosen_0..chosen_{P-1}, rejected_0..]``,
prompts left-padded, completions right-padded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from comlrl_lightning.core.loss import completion_logprobs
from comlrl_lightning.core.records import AgentStats, StepOutput
from comlrl_lightning.preference.dpo import sequence_logps
from comlrl_lightning.preference.pairs import PreferencePair
from comlrl_lightning.preference.selection import PairSet


@dataclass(frozen=True)
class PairTokens:
    """One pair's tokens for one agent: 1-D CPU long tensors without padding.

    Attributes:
        chosen_prompt, rejected_prompt: the prompt each side was sampled from (the same text for a
            team of independent agents; an actor may condition rows differently).
        chosen, rejected: the completions (up to and including EOS).
        chosen_clipped, rejected_clipped: whether each hit ``max_new_tokens`` without EOS.
    """

    chosen_prompt: torch.Tensor
    rejected_prompt: torch.Tensor
    chosen: torch.Tensor
    rejected: torch.Tensor
    chosen_clipped: bool = False
    rejected_clipped: bool = False

    def to_state(self) -> dict[str, Any]:
        """Checkpoint form (tensors and bools only)."""
        return dict(vars(self))

    @classmethod
    def from_state(cls, d: dict[str, Any]) -> PairTokens:
        return cls(**d)


def pair_tokens(pairs: PairSet) -> list[list[PairTokens]]:
    """``[P][N]`` each pair's tokens for every agent, cut from ``pairs.turn`` (aligned rows: candidate
    ``k`` of node ``g`` is row ``g·K + k``)."""
    k, out = pairs.num_candidates, []
    for ix in pairs.index:
        per_agent = []
        for gen in pairs.turn.generations:
            w, r = ix.node * k + ix.chosen, ix.node * k + ix.rejected

            def cut(ids: torch.Tensor, mask: torch.Tensor, row: int) -> torch.Tensor:
                return ids[row][mask[row].bool()].detach().cpu().clone()

            per_agent.append(
                PairTokens(
                    cut(gen.prompt_ids, gen.prompt_mask, w),
                    cut(gen.prompt_ids, gen.prompt_mask, r),
                    cut(gen.completion_ids, gen.completion_mask, w),
                    cut(gen.completion_ids, gen.completion_mask, r),
                    bool(gen.clipped[w]),
                    bool(gen.clipped[r]),
                )
            )
        out.append(per_agent)
    return out


def collate(prompts: list[torch.Tensor], completions: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """``(prompt_ids, prompt_mask, completion_ids, completion_mask)``: ``[R, P]`` left-padded prompts and
    ``[R, C]`` right-padded completions (pad id 0, masked out)."""
    r = len(prompts)
    p = max(len(x) for x in prompts)
    c = max(max(len(x) for x in completions), 1)
    prompt_ids = torch.zeros(r, p, dtype=torch.long)
    prompt_mask = torch.zeros(r, p, dtype=torch.long)
    completion_ids = torch.zeros(r, c, dtype=torch.long)
    completion_mask = torch.zeros(r, c, dtype=torch.long)
    for i, (q, a) in enumerate(zip(prompts, completions)):
        if len(q):
            prompt_ids[i, p - len(q) :], prompt_mask[i, p - len(q) :] = q, 1
        completion_ids[i, : len(a)], completion_mask[i, : len(a)] = a, 1
    return prompt_ids, prompt_mask, completion_ids, completion_mask


def agent_pair_logps(
    model: nn.Module, tokens: list[PairTokens], temperature: float, mean: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """``([P], [P])`` sequence log-probs of the chosen and rejected completions of ``tokens`` (one
    agent's side of ``P`` pairs) under ``logits / temperature``, in one forward; with gradient unless
    called under ``torch.no_grad``. ``mean``: per-token mean instead of the sum (``ipo``)."""
    prompts = [t.chosen_prompt for t in tokens] + [t.rejected_prompt for t in tokens]
    completions = [t.chosen for t in tokens] + [t.rejected for t in tokens]
    pi, pm, ci, cm = collate(prompts, completions)
    token_logps = completion_logprobs(model, pi, pm, ci, cm, temperature)
    seq = sequence_logps(token_logps, cm.to(token_logps.device), mean)
    return seq[: len(tokens)], seq[len(tokens) :]


def pair_step_output(
    pairs: list[PreferencePair], tokens: list[list[PairTokens]], stats: list[AgentStats]
) -> StepOutput:
    """A one-shot step's :class:`StepOutput`: the ``P`` pairs it trained on as ``P`` episodes of two
    joint actions (``K = 2``: row ``2p`` the chosen, ``2p + 1`` the rejected one); rewards are the
    pairs' task rewards (from when the pair set was built), prompts the agents' observation texts."""
    n = len(stats)
    chosen = torch.tensor([p.chosen_reward or 0.0 for p in pairs])
    rejected = torch.tensor([p.rejected_reward or 0.0 for p in pairs])
    per_pair = torch.stack([chosen, rejected], 1)  # [P, 2]
    rewards = per_pair.flatten()
    std = per_pair.std(1)
    lengths = [
        torch.tensor([len(x) for row in tokens for x in (row[i].chosen, row[i].rejected)]) for i in range(n)
    ]
    clipped = [
        torch.tensor([c for row in tokens for c in (row[i].chosen_clipped, row[i].rejected_clipped)])
        for i in range(n)
    ]
    prompts = [[p.prompts[i] for p in pairs] for i in range(n)]
    return StepOutput(
        loss=torch.tensor(sum(s.loss for s in stats)),
        rewards=rewards,
        reward_std=std.mean(),
        frac_reward_zero_std=(std == 0).float().mean(),
        reward_components={},
        turn_rewards=[rewards],
        turn_returns=[rewards],
        completion_lengths=lengths,
        clipped=clipped,
        agent_stats=stats,
        num_episodes=len(pairs),
        num_tokens=int(sum(int(x.sum()) for x in lengths)),
        prompts=prompts,
        completions=[[t for p in pairs for t in (p.chosen[i], p.rejected[i])] for i in range(n)],
        turn0_rewards=per_pair,
        num_generations=2,
        user_prompts=prompts,
    )
