"""Held-out evaluation of a coordinator: each episode played once through the stages, nothing trained.

A validation path is one joint response of one episode: stage 0's learner answers the episode's
prompt once, every later stage answers once after it (``K = 1`` at every stage, so ``aligned`` and
``cross`` coincide), and the shared reward scores the path. Decoding is greedy (one path per
episode), as the Lightning modules validate; ``num_generations_eval = n > 1`` (or
``val_sampling=True``) samples ``n`` independent paths per episode with each learner's own
``SamplingConfig``, and ``val/pass@k`` is the unbiased estimator of
:mod:`comlrl_lightning.core.evaluation`.

Logged names (the modules' validation names, :mod:`comlrl_lightning.core.metrics`): ``val/reward``
(mean shared reward over paths), ``val/rewards/<name>/mean`` (each reward function and metric),
``val/pass@k`` when the reward reports :data:`~comlrl_lightning.envs.rewards.PASS_AT_1` (a path
the reward could not judge counts as unsolved).

Training state is untouched: no experience is stored, no learner updates, and the Python, NumPy and
torch (CPU, CUDA) RNG states are restored afterwards, so a run that evaluates draws the same training samples
as one that does not (and a resumed run equals an uninterrupted one with evaluation on).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from comlrl_lightning.coordinator.rounds import Stage, check_stage_fields, play_round
from comlrl_lightning.core import metrics as M
from comlrl_lightning.core.evaluation import pass_at_ks, repeat_episodes
from comlrl_lightning.core.generation import Generation
from comlrl_lightning.envs.base import Episode
from comlrl_lightning.envs.rewards import WeightedReward
from comlrl_lightning.infra.rng import collect_rng_states, set_rng_states


@dataclass
class EvalOutput:
    """The result of one evaluation of ``E`` episodes × ``n`` paths (path ``e·n + s``).

    Attributes:
        round: the rounds played when it ran (the x of its logged points).
        rewards: ``[E·n]`` shared rewards of the paths.
        solved: ``[E·n]`` 1.0 where the path solved the episode (0.0 where the reward could not
            judge), or None when the reward reports no ``PASS_AT_1``.
        joint_responses: ``E·n`` lists of one response per stage.
        episode_indices: ``[E·n]`` the episode of each path.
        metrics: the logged scalars (``val/reward``, ``val/pass@k``, ``val/rewards/<name>/mean``).
    """

    round: int
    rewards: torch.Tensor
    solved: torch.Tensor | None
    joint_responses: list[list[str]]
    episode_indices: list[int]
    metrics: dict[str, float] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        """A plain-Python copy (the coordinator's ``eval_history`` entry, kept in its checkpoints)."""
        return {
            "round": self.round,
            **self.metrics,
            "rewards": self.rewards.tolist(),
            "solved": None if self.solved is None else self.solved.tolist(),
            "episode_indices": list(self.episode_indices),
        }


class _Answerer:
    """A learner seen by :func:`play_round` as answering once per prompt (greedy unless ``sample``)."""

    num_generations = 1

    def __init__(self, learner: Any, sample: bool) -> None:
        self.learner, self.sample = learner, sample

    def render(self, prompt: str) -> str:
        return self.learner.render(prompt)

    def generate(self, rendered: Sequence[str], k: int) -> Generation:
        return self.learner.generate(list(rendered), k, greedy=not self.sample)

    def advantages(self, returns: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(returns)  # nothing trains on evaluation paths


def evaluate_episodes(
    round: int,
    stages: Sequence[Stage],
    episodes: Sequence[Episode],
    learners: Mapping[str, Any],
    reward: WeightedReward,
    num_generations_eval: int = 1,
    pass_at_k: Sequence[int] | None = None,
    val_sampling: bool = False,
    batch_size: int | None = None,
) -> EvalOutput:
    """Play every episode ``num_generations_eval`` times through ``stages`` and score the paths.

    Args:
        round: the x of the result (rounds played so far); also the reward's ``step``.
        stages, learners, reward: the coordinator's.
        episodes: the ``E`` held-out episodes.
        num_generations_eval: ``n`` paths per episode (>= 1); n > 1 samples them.
        pass_at_k: the k of ``val/pass@k``, each in ``[1, n]`` (None: ``[1, n]``, ``[1]`` when n = 1).
        val_sampling: sample the one path of ``n = 1`` with the learners' sampling configs instead of
            decoding greedily.
        batch_size: paths per batched generate call (None: all at once).

    Returns:
        An :class:`EvalOutput` (``E·n`` paths, episode-major).

    Raises:
        ValueError: an empty ``episodes``, ``n`` < 1, a ``k`` outside ``[1, n]``, ``batch_size`` < 1,
            an episode without a field a stage's template uses.
    """
    n = num_generations_eval
    ks = list(pass_at_k) if pass_at_k is not None else sorted({1, n})
    checks = [
        ("episodes", len(episodes), len(episodes) >= 1, "at least one episode"),
        ("num_generations_eval", n, n >= 1, ">= 1"),
        ("pass_at_k", ks, bool(ks) and all(1 <= k <= n for k in ks), f"non-empty, each k in [1, {n}]"),
        ("batch_size", batch_size, batch_size is None or batch_size >= 1, ">= 1 or None"),
    ]
    for name, value, ok, allowed in checks:
        if not ok:
            raise ValueError(f"evaluate: {name}: got {value!r}, must be {allowed}")
    check_stage_fields(stages, episodes)
    players = {name: _Answerer(lr, sample=val_sampling or n > 1) for name, lr in learners.items()}
    paths = repeat_episodes(episodes, n)
    step = batch_size or len(paths)
    rng = collect_rng_states()
    try:
        outs = [
            play_round(round, stages, paths[i : i + step], players, reward, "aligned")
            for i in range(0, len(paths), step)
        ]
    finally:
        set_rng_states(rng)
    rewards = torch.cat([o.rewards if o.rewards.dim() == 1 else o.rewards.mean(-1) for o in outs])
    solved = None
    if all(o.pass_at_1 is not None for o in outs):
        solved = torch.nan_to_num(torch.cat([o.pass_at_1.float() for o in outs]), nan=0.0)
    metrics = {M.VAL_REWARD: float(rewards.mean())}
    for name in outs[0].components:
        metrics[M.reward_fn(name, "val/")] = float(torch.cat([o.components[name] for o in outs]).nanmean())
    if solved is not None:
        for k, per_episode in pass_at_ks(solved, n, ks).items():
            metrics[M.val_pass_at(k)] = float(per_episode.mean())
    return EvalOutput(
        round,
        rewards,
        solved,
        [j for o in outs for j in o.joint_responses],
        [e for o in outs for e in o.episode_indices],
        metrics,
    )
