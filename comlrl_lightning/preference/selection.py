"""Preference pairs from a rollout: per prompt, ``preference_num_candidates`` joint responses scored
by the task reward, then winner/loser pairs chosen by ``pair_selection`` (CoMLRL ``madpo.py``:
``_generate_preference_pairs_for_item`` and ``_select_preference_pair_indices``).

What MADPO trains on and MARLHF's reward model learns from. :func:`build_preference_pairs` is the
entry point (rollout → selection → :class:`~comlrl_lightning.preference.pairs.PreferencePair` records);
:func:`select_pair_indices` is the selection alone, on one prompt's list of rewards.

Selection, over one prompt's ``K`` candidates with rewards ``r``: every ordered pair ``(w, l)``,
``w ≠ l``, with ``r[w] − r[l] > 0`` is a candidate (ties are never a pair, as in CoMLRL); then

- ``reward_gap``: largest gap first (equal gaps in ``(w, l)`` order), the first ``limit``;
- ``all``: every candidate in ``(w, l)`` order (``limit`` must be None);
- ``random``: ``rng.shuffle`` of the candidates (listed in ``(w, l)`` order first), the first ``limit``.

With the global ``random`` module as ``rng`` (the default) and the same ``random.seed``, ``random``
picks what CoMLRL 1.4.3 picks (``tests/test_vs_comlrl_madpo.py``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from comlrl_lightning.core.records import Turn
from comlrl_lightning.core.rollout import Actors, RolloutPlan, compute_returns, rollout_tree
from comlrl_lightning.envs.base import DecPOMDP, Episode
from comlrl_lightning.preference.pairs import PAIR_SELECTION, PreferencePair

PairSelection = PAIR_SELECTION.literal


@dataclass
class PreferenceConfig:
    """How preference pairs are built from rollouts (CoMLRL's names and defaults; MADPO, MARLHF).

    Raises:
        ValueError: ``preference_num_candidates < 2``, an unknown ``pair_selection`` or
            ``comparator_reward`` (unless :attr:`with_comparator`), or a bad
            ``preference_pairs_per_sample`` (see :func:`check_limit`), naming the field.
    """

    with_comparator: ClassVar[bool] = False
    """Whether pairs are formed against a comparator (the iterative trainers' subclass): only then is
    ``pair_selection="comparator_reward"`` accepted. Not a field."""

    preference_num_candidates: int = 80
    """Joint responses sampled per prompt (K, >= 2; one batched ``generate`` per agent). CoMLRL name."""
    preference_pairs_per_sample: int | None = 16
    """At most this many pairs per prompt (>= 1); must be null with ``pair_selection="all"``. CoMLRL name."""
    pair_selection: PairSelection = "reward_gap"
    """One of :data:`PAIR_SELECTION` but ``comparator_reward`` (iterative trainers only). CoMLRL name."""

    def __post_init__(self) -> None:
        k = self.preference_num_candidates
        if isinstance(k, bool) or not isinstance(k, int) or k < 2:
            raise ValueError(f"preference_num_candidates: got {k!r}, must be an integer >= 2")
        PAIR_SELECTION.check(self.pair_selection)
        if not self.with_comparator:
            refuse_comparator_reward(self.pair_selection, "preference.pair_selection")
        check_limit(self.pair_selection, self.preference_pairs_per_sample)


def select_pair_indices(
    rewards: Sequence[float],
    pair_selection: str = "reward_gap",
    limit: int | None = 16,
    rng: Any = None,
) -> list[tuple[int, int]]:
    """The ``(winner, loser)`` candidate indices of one prompt (module docstring for the rule).

    Args:
        rewards: ``[K]`` the candidates' scalar rewards.
        pair_selection: one of :data:`PAIR_SELECTION`.
        limit: at most this many pairs (``preference_pairs_per_sample``); None: no limit. Must be
            None with ``all`` (CoMLRL's rule).
        rng: what ``random`` shuffles with (``.shuffle``); None: the global ``random`` module.

    Returns:
        Pairs with ``rewards[w] > rewards[l]``; empty when every reward is equal.

    Raises:
        ValueError: an unknown ``pair_selection`` or ``comparator_reward``, ``limit < 1``, or a
            ``limit`` with ``all``.
    """
    PAIR_SELECTION.check(pair_selection)
    refuse_comparator_reward(pair_selection)
    check_limit(pair_selection, limit)
    candidates = [
        (float(rw) - float(rl), w, r)
        for w, rw in enumerate(rewards)
        for r, rl in enumerate(rewards)
        if w != r and float(rw) - float(rl) > 0
    ]
    if pair_selection == "random":
        (random if rng is None else rng).shuffle(candidates)
    elif pair_selection == "reward_gap":
        candidates.sort(key=lambda c: c[0], reverse=True)  # stable: equal gaps stay in (w, l) order
    if limit is not None:
        candidates = candidates[:limit]
    return [(w, r) for _, w, r in candidates]


def refuse_comparator_reward(pair_selection: str, field: str = "pair_selection") -> None:
    """Raises ValueError for ``comparator_reward``: it ranks pairs against a comparator's samples (the
    iterative trainers' :mod:`~comlrl_lightning.preference.comparator.pairing`), which one prompt's candidates lack."""
    if pair_selection == "comparator_reward":
        raise ValueError(
            f"{field}: got 'comparator_reward', which ranks pairs against a comparator's samples; "
            "without a comparator use 'reward_gap', 'all' or 'random' (or MADPOIter, which has one)"
        )


def check_limit(pair_selection: str, limit: int | None) -> None:
    """Raises ValueError unless ``limit`` (``preference_pairs_per_sample``) is None or >= 1, and None
    with ``pair_selection="all"``."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"preference_pairs_per_sample: got {limit!r}, must be an integer >= 1 or null")
    if pair_selection == "all" and limit is not None:
        raise ValueError(
            f"preference_pairs_per_sample: got {limit!r} with pair_selection='all'; 'all' keeps every "
            "non-tied pair, so leave it null (or use 'reward_gap' / 'random' with a limit)"
        )


@dataclass(frozen=True)
class PairIndex:
    """Where a pair's two joint actions are in the rollout's :class:`~comlrl_lightning.core.records.Turn`.

    Attributes:
        node: the prompt (node ``g`` of the turn, episode order).
        chosen: the winner's candidate index ``k`` (generation row ``g·K + k`` of every agent).
        rejected: the loser's candidate index.
    """

    node: int
    chosen: int
    rejected: int


@dataclass
class PairSet:
    """Pairs built from one rollout (:func:`build_preference_pairs`).

    Attributes:
        pairs: the :class:`PreferencePair` records, prompt by prompt, in selection order.
        index: ``[P]`` where each pair's joint actions are in ``turn`` (same order as ``pairs``).
        turn: the one-turn rollout of ``K`` candidates per prompt the pairs come from (token ids,
            masks, rewards: what a DPO loss needs without re-tokenising).
        rewards: ``[G, K]`` the scalar candidate rewards selection used (team mean of per-agent rewards).
    """

    pairs: list[PreferencePair]
    index: list[PairIndex]
    turn: Turn
    rewards: torch.Tensor

    @property
    def num_candidates(self) -> int:
        return int(self.rewards.shape[1])


def candidate_rewards(turn: Turn) -> torch.Tensor:
    """``[G, K]`` scalar reward of each candidate joint action: ``turn.rewards``, averaged over agents
    when the reward is per agent (``[G, K, N]``; CoMLRL's rewards are scalar)."""
    r = turn.rewards
    return r.float().mean(-1) if r.dim() == 3 else r.float()


def pairs_of_turn(
    turn: Turn,
    pair_selection: str = "reward_gap",
    pairs_per_sample: int | None = 16,
    rng: Any = None,
    prompts: list[list[str]] | None = None,
) -> PairSet:
    """Select pairs among each node's candidates of a rolled-out ``turn`` (aligned joint actions:
    candidate ``k`` of node ``g`` is row ``g·K + k`` of every agent). Nodes go in order, each
    drawing from ``rng`` once under ``random`` (CoMLRL's call order, one item at a time).
    ``prompts``: per trained policy, per node, the prompt text a pair records (default: each agent's
    observation; a joint actor's: its joint prompt). A pair's ``chosen`` / ``rejected`` hold one text
    per trained policy (a joint actor: its joint completion).

    Raises:
        ValueError: as :func:`select_pair_indices`; a turn whose joint actions are not aligned.
    """
    rewards = candidate_rewards(turn)
    g, k = rewards.shape
    n = len(turn.generations)
    if any(len(gen.texts) != g * k for gen in turn.generations):
        raise ValueError(
            "pairs_of_turn: the turn's joint actions are not aligned (rows != nodes × candidates)"
        )
    pairs, index = [], []
    for node in range(g):
        for w, r in select_pair_indices(rewards[node].tolist(), pair_selection, pairs_per_sample, rng):
            texts = [turn.generations[i].texts for i in range(n)]
            pairs.append(
                PreferencePair(
                    prompts=[
                        turn.nodes[node].prompts[i][-1] if prompts is None else prompts[i][node]
                        for i in range(n)
                    ],
                    chosen=[texts[i][node * k + w] for i in range(n)],
                    rejected=[texts[i][node * k + r] for i in range(n)],
                    chosen_reward=float(rewards[node, w]),
                    rejected_reward=float(rewards[node, r]),
                    episode=dict(turn.nodes[node].episode.data),
                )
            )
            index.append(PairIndex(node, w, r))
    return PairSet(pairs, index, turn, rewards)


def build_preference_pairs(
    env: DecPOMDP,
    episodes: Sequence[Episode],
    actors: Actors,
    num_candidates: int,
    pair_selection: str = "reward_gap",
    pairs_per_sample: int | None = 16,
    rng: Any = None,
    step: int = -1,
) -> PairSet:
    """Sample ``num_candidates`` joint responses per episode (one turn, aligned: one batched
    ``generate`` per agent through ``actors``), score them with ``env``'s reward, select pairs.

    Args:
        env: the Dec-POMDP (its reward scores the candidates).
        episodes: ``E`` prompts.
        actors: who generates (``module.actors``: the team, or a centralized actor).
        num_candidates: ``K`` (``preference_num_candidates``, >= 2).
        pair_selection, pairs_per_sample, rng: see :func:`select_pair_indices`.
        step: training step, for reward error messages.

    Returns:
        :class:`PairSet`: ``.pairs`` are the records (``PreferencePair.prompts`` are the agents'
        observation texts, before any chat template), ``.turn`` the rollout with token ids.

    Raises:
        ValueError: ``num_candidates < 2`` or a bad selection (before anything is generated).
    """
    if isinstance(num_candidates, bool) or not isinstance(num_candidates, int) or num_candidates < 2:
        raise ValueError(f"preference_num_candidates: got {num_candidates!r}, must be an integer >= 2")
    PAIR_SELECTION.check(pair_selection)
    refuse_comparator_reward(pair_selection)
    check_limit(pair_selection, pairs_per_sample)
    turns = rollout_tree(env, episodes, actors, RolloutPlan(num_generations=num_candidates), step=step)
    compute_returns(turns, 1.0)  # one turn: each candidate's return is its reward
    joint = getattr(actors, "joint_prompts", None)  # a joint actor (team/centralized.JointActor)
    prompts = [list(joint)] if joint is not None and len(turns[0].generations) == 1 else None
    return pairs_of_turn(turns[0], pair_selection, pairs_per_sample, rng, prompts)
