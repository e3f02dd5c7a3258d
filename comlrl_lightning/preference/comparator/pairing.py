"""Pairing a round's samples: current candidate ``i`` against comparator candidate ``i``, ordered by
a reward, as :class:`~comlrl_lightning.preference.pairs.PreferencePair` records.

The rule (CoMLRL 1.4.3 ``MADPOIterTrainer._select_policy_comparison_pairs``, same sort keys and the
same stable order on equal keys): for ``i < min(K, K')`` the side with the higher reward is
``chosen``; a tie forms no pair (nor does a non-finite reward: CoMLRL's comparisons are False for a
NaN, so it drops those too). Then ``pair_selection`` orders the pairs and keeps
``preference_pairs_per_sample`` of them (all of them for ``all``):

- ``reward_gap``: largest ``|gap|`` first;
- ``all``: candidate order, no limit;
- ``random``: shuffled by the caller's seeded ``random.Random`` (CoMLRL shuffles the global
  ``random``; the same seed and call order give the same pairs);
- ``comparator_reward``: highest comparator reward first, then the largest gap (CoMLRL's
  iterative default): pairs against the comparator's best samples.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

from comlrl_lightning.preference.pairs import PAIR_SELECTION, PreferencePair

Side = tuple[str, int]
"""``("current" | "comparator", candidate index)``."""


def comparison_order(
    current_rewards: Sequence[float],
    comparator_rewards: Sequence[float],
    pair_selection: str,
    pairs_per_sample: int | None,
    rng: random.Random | None = None,
) -> list[tuple[Side, Side]]:
    """``(chosen, rejected)`` sides of one episode's pairs, in ``pair_selection`` order.

    Args:
        current_rewards: ``[K]`` the current policy's joint-response rewards.
        comparator_rewards: ``[K']`` the comparator's.
        pairs_per_sample: pairs kept (None: all); ignored for ``all``.
        rng: the generator of ``random`` (required for it).

    Raises:
        ValueError: ``pair_selection`` not one of :data:`PAIR_SELECTION`, or ``random`` without ``rng``.
    """
    PAIR_SELECTION.check(pair_selection)
    candidates: list[tuple[float, float, int, Side, Side]] = []
    for i in range(min(len(current_rewards), len(comparator_rewards))):
        cur, comp = float(current_rewards[i]), float(comparator_rewards[i])
        if not (math.isfinite(cur) and math.isfinite(comp)) or cur == comp:
            continue
        sides = (("current", i), ("comparator", i)) if cur > comp else (("comparator", i), ("current", i))
        candidates.append((abs(cur - comp), comp, i, *sides))
    if pair_selection == "random":
        if rng is None:
            raise ValueError("pair_selection='random' needs the caller's seeded random.Random (rng)")
        rng.shuffle(candidates)
    elif pair_selection == "all":
        candidates.sort(key=lambda c: c[2])
    elif pair_selection == "comparator_reward":
        candidates.sort(key=lambda c: (c[1], c[0]), reverse=True)
    else:
        candidates.sort(key=lambda c: c[0], reverse=True)
    if pair_selection != "all" and pairs_per_sample is not None:
        candidates = candidates[:pairs_per_sample]
    return [(c[3], c[4]) for c in candidates]


def pair_with_comparator(
    prompts: Sequence[str],
    current: Sequence[Sequence[str]],
    current_rewards: Sequence[float],
    comparator: Sequence[Sequence[str]],
    comparator_rewards: Sequence[float],
    pair_selection: str,
    pairs_per_sample: int | None,
    rng: random.Random | None = None,
    episode: dict[str, Any] | None = None,
) -> list[PreferencePair]:
    """One episode's pairs (see the module docstring).

    Args:
        prompts: ``[N]`` each agent's observation text.
        current: ``[N][K]`` the current policy's texts per agent (joint response ``k`` is column ``k``).
        current_rewards: ``[K]``.
        comparator: ``[N][K']`` the comparator's texts.
        comparator_rewards: ``[K']``.
        episode: the dataset row, kept in each pair.

    Raises:
        ValueError: as :func:`comparison_order`.
    """
    texts = {"current": current, "comparator": comparator}
    rewards = {"current": current_rewards, "comparator": comparator_rewards}
    out = []
    for (cs, ci), (rs, ri) in comparison_order(
        current_rewards, comparator_rewards, pair_selection, pairs_per_sample, rng
    ):
        out.append(
            PreferencePair(
                prompts=list(prompts),
                chosen=[agent[ci] for agent in texts[cs]],
                rejected=[agent[ri] for agent in texts[rs]],
                chosen_reward=float(rewards[cs][ci]),
                rejected_reward=float(rewards[rs][ri]),
                episode=dict(episode or {}),
            )
        )
    return out


def pairs_for_batch(
    prompts: Sequence[Sequence[str]],
    current: Sequence[Sequence[str]],
    current_rewards: Sequence[float],
    comparator: Sequence[Sequence[str]],
    comparator_rewards: Sequence[float],
    num_candidates: int,
    comparator_candidates: int,
    pair_selection: str,
    pairs_per_sample: int | None,
    rng: random.Random | None = None,
    episodes: Sequence[dict[str, Any]] | None = None,
    ok: Sequence[bool] | None = None,
) -> list[PreferencePair]:
    """The pairs of ``B`` episodes, episode by episode (an episode with ``ok[b]`` False forms none).

    Args:
        prompts: ``[N][B]`` observation texts.
        current: ``[N][B·K]`` (row ``b·K + k``); ``current_rewards`` ``[B·K]``.
        comparator: ``[N][B·K']``; ``comparator_rewards`` ``[B·K']`` (a
            :class:`~comlrl_lightning.preference.comparator.policies.ComparatorSample`'s ``texts``).
        ok: ``[B]`` the comparator sample's ``ok`` (None: all).
    """
    k, kc = num_candidates, comparator_candidates
    out: list[PreferencePair] = []
    for b in range(len(prompts[0])):
        if ok is not None and not ok[b]:
            continue
        out += pair_with_comparator(
            [p[b] for p in prompts],
            [agent[b * k : (b + 1) * k] for agent in current],
            current_rewards[b * k : (b + 1) * k],
            [agent[b * kc : (b + 1) * kc] for agent in comparator],
            comparator_rewards[b * kc : (b + 1) * kc],
            pair_selection,
            pairs_per_sample,
            rng,
            episodes[b] if episodes is not None else None,
        )
    return out
