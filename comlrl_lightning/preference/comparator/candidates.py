"""One batch of a round's build phase: the current agents' candidates and the comparator's for the
same prompts, scored by the task reward and paired (CoMLRL 1.4.3
``MADPOIterTrainer._generate_preference_pairs_for_item``, batched over episodes).

Single-turn, as CoMLRL's iterative trainers (they refuse ``num_turns > 1``). Episodes whose comparator
sample failed (``ComparatorSample.ok``) are not scored on the comparator side (no reward call for
empty texts) and form no pairs.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from comlrl_lightning.core.generation import render_prompt
from comlrl_lightning.preference.comparator.pairing import pairs_for_batch
from comlrl_lightning.preference.comparator.policies import Comparator, ComparatorSample
from comlrl_lightning.preference.pairs import PreferencePair


@dataclass
class CandidateBatch:
    """What one build batch produced.

    Attributes:
        pairs: the batch's preference pairs, episode by episode.
        current_rewards: ``[B·K]`` the current joint responses' shared rewards (row ``b·K + k``).
        comparator_rewards: ``[B·K']`` the comparator's (NaN where its episode failed).
        sample: the comparator's sample (texts, ``ok``).
        samples: joint responses generated, current plus comparator (the sample budget).
    """

    pairs: list[PreferencePair]
    current_rewards: torch.Tensor
    comparator_rewards: torch.Tensor
    sample: ComparatorSample
    samples: int


def _shared(total: torch.Tensor, who: str) -> torch.Tensor:
    if total.dim() != 1:
        raise ValueError(
            f"{who}: preference pairs need one shared reward per joint action; the reward returned "
            f"per-agent values of shape {tuple(total.shape)}"
        )
    return total.float()


def build_candidates(
    team,
    env,
    comparator: Comparator,
    episodes: Sequence,
    num_candidates: int,
    comparator_candidates: int,
    pair_selection: str,
    pairs_per_sample: int | None,
    rng: random.Random | None = None,
    step: int = -1,
) -> CandidateBatch:
    """Sample, score and pair one batch of ``B`` episodes.

    Args:
        team: the :class:`~comlrl_lightning.team.team.Team` being trained (its ``generate``).
        env: the :class:`~comlrl_lightning.envs.base.DecPOMDP` (``observe``, ``reward``).
        comparator: inside a round (after ``begin_round``).
        episodes: ``B`` :class:`~comlrl_lightning.envs.base.Episode`.
        num_candidates: ``K``, the current policy's samples per episode (``preference_num_candidates``).
        comparator_candidates: ``K'`` (``comparator_num_candidates``, or ``K``).
        step: passed to the reward (its logs).

    Raises:
        ValueError: the reward returns per-agent values, or as
            :func:`~comlrl_lightning.preference.comparator.pairing.comparison_order`.
        ComparatorError: the comparator failed and ``comparator_on_error="stop"``.
    """
    n, k, kc = env.num_agents, num_candidates, comparator_candidates
    prompts = [[env.observe(ep, i) for ep in episodes] for i in range(n)]
    rendered = [
        [render_prompt(team.tokenizers[i], [p], [], team.specs[i].chat_template) for p in prompts[i]]
        for i in range(n)
    ]
    current = [g.texts for g in team.generate(rendered, k)]
    sample = comparator.sample(prompts, kc, [ep.data for ep in episodes])
    cur_joint = [[current[i][r] for i in range(n)] for r in range(len(episodes) * k)]
    cur_rewards = _shared(
        env.reward(cur_joint, [ep for ep in episodes for _ in range(k)], 0, step=step).total, "reward"
    )
    cmp_rewards = torch.full((len(episodes) * kc,), float("nan"))
    rows = [b * kc + j for b, ok in enumerate(sample.ok) if ok for j in range(kc)]
    if rows:
        joint = [[sample.texts[i][r] for i in range(n)] for r in rows]
        scored = env.reward(joint, [episodes[r // kc] for r in rows], 0, step=step).total
        cmp_rewards[rows] = _shared(scored, "reward")
    pairs = pairs_for_batch(
        prompts,
        current,
        cur_rewards.tolist(),
        sample.texts,
        cmp_rewards.tolist(),
        k,
        kc,
        pair_selection,
        pairs_per_sample,
        rng,
        [ep.data for ep in episodes],
        sample.ok,
    )
    return CandidateBatch(pairs, cur_rewards, cmp_rewards, sample, len(episodes) * (k + kc))
