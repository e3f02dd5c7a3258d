"""Group-baseline advantages for the MAGRPO family, and joint-action bookkeeping.

A *group* is the K sibling samples of one agent at one node of the rollout tree (same episode,
same turn, same history). The baselines (CoMLRL ``advantage_mode``; design.md, "Algorithm
reference") are declared once in :data:`ADVANTAGE_MODE`, each with its formula, and implemented in
:data:`BASELINES`.

``scale_rewards="group"`` then divides by ``std(R) + eps`` (unbiased std over the group, as TRL
does); a group whose returns are all equal gets advantage exactly 0 in every mode. ``raw`` is not
scaled unless asked (:func:`default_scale`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch

from comlrl_lightning.core.choices import Choice

ADVANTAGE_MODE = Choice(
    "advantage_mode",
    {
        "mean": "`A_k = R_k − mean(R)` (GRPO, MAGRPO)",
        "max": "`A_k = R_k − max(R)` (MAReMax)",
        "rloo": "`A_k = R_k − mean(R without k) = (K·R_k − ΣR)/(K − 1)` (leave-one-out, MARLOO; K ≥ 2)",
        "raw": "`A_k = R_k`, no baseline (MAREINFORCE; not std-scaled unless asked)",
    },
)
"""The group baselines over the K siblings of a node (CoMLRL ``advantage_mode``)."""


def _loo(returns: torch.Tensor) -> torch.Tensor:
    k = returns.shape[-1]
    if k < 2:
        raise ValueError("advantage_mode='rloo' needs num_generations >= 2")
    return (k * returns - returns.sum(-1, keepdim=True)) / (k - 1)


BASELINES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "mean": lambda r: r - r.mean(-1, keepdim=True),
    "max": lambda r: r - r.max(-1, keepdim=True).values,
    "rloo": _loo,
    "raw": lambda r: r.clone(),
}
"""``advantage_mode`` -> ``[G, K]`` returns to ``[G, K]`` baseline-subtracted advantages."""
assert tuple(BASELINES) == ADVANTAGE_MODE.names, "every advantage_mode needs a baseline"

SCALE_REWARDS = Choice(
    "scale_rewards",
    {
        "group": "divide by the group's std + `advantage_eps` (GRPO, Shao et al. 2024)",
        "batch": "divide by the std over the whole step, every turn (TRL's `batch`; PPO Lite, "
        "arXiv 2508.08221: robust when groups are small)",
        "none": "do not divide (Dr. GRPO, Liu et al. 2025: the std division biases towards easy and "
        "hard questions)",
    },
)
"""How advantages are scaled (TRL ``scale_rewards``; ``true``/``false`` mean ``group``/``none``)."""

JOINT_MODE = Choice(
    "joint_mode",
    {
        "aligned": "the k-th sample of every agent forms joint action k (K per node)",
        "cross": "every combination of the agents' samples (K^N per node)",
    },
    aliases={"crossed": "cross"},
)
"""How a node's samples form joint actions (:func:`joint_action_indices`)."""


def default_scale(mode: str) -> str:
    """The std scaling a baseline gets when none is configured: ``none`` for ``raw`` (A = R; a raw
    return divided by a near-zero group std is ~R/eps, e.g. ~1e4 for [1, 1+1e-7, 1, 1]), else ``group``."""
    return "none" if mode == "raw" else "group"


def group_advantages(
    returns: torch.Tensor, mode: str = "mean", scale: str | None = None, eps: float = 1e-4
) -> torch.Tensor:
    """Advantages of ``G`` groups of ``K`` samples.

    Args:
        returns: ``[G, K]`` returns (float).
        mode: one of :data:`ADVANTAGE_MODE`.
        scale: ``"group"`` (divide by the group's std + ``eps``), ``"none"``, or None for
            :func:`default_scale` of ``mode``.
        eps: std floor, ≥ 1e-4 recommended so near-equal groups do not explode.

    Returns:
        ``[G, K]`` advantages; rows with zero std are exactly 0 when ``scale="group"``.

    Raises:
        ValueError: unknown ``mode``/``scale``, or ``K < 2`` for ``rloo``.
    """
    ADVANTAGE_MODE.check(mode)
    scale = default_scale(mode) if scale is None else scale
    if scale not in ("group", "none"):  # "batch" needs the whole step: scale_by_std
        raise ValueError(f"scale_rewards: got {scale!r}, allowed here: ['group', 'none']")
    returns = returns.float()
    k = returns.shape[-1]
    adv = BASELINES[mode](returns)
    if scale == "group":
        std = returns.std(-1, keepdim=True) if k > 1 else torch.zeros_like(returns[..., :1])
        adv = torch.where(std > 0, adv / (std + eps), torch.zeros_like(adv))
    return adv


def joint_action_indices(num_agents: int, num_generations: int, joint_mode: str) -> torch.Tensor:
    """Which sample of each agent forms each joint action at a node.

    Returns:
        ``[J, N]`` long: row ``j`` gives the sample index of every agent in joint action ``j``.
        ``aligned``: ``J = K``, row ``j = (j, …, j)``; ``cross``: ``J = K^N``, the Cartesian product
        in lexicographic order (agent 0 slowest).

    Raises:
        ValueError: unknown ``joint_mode`` (the canonical names: ``crossed`` is read as ``cross`` by the config).
    """
    if joint_mode == "aligned":
        return torch.arange(num_generations)[:, None].expand(num_generations, num_agents).clone()
    if joint_mode == "cross":
        return torch.tensor(
            list(itertools.product(range(num_generations), repeat=num_agents)), dtype=torch.long
        )
    raise ValueError(f"joint_mode: got {joint_mode!r}, allowed: {list(JOINT_MODE.names)}")


def agent_sample_returns(
    joint_returns: torch.Tensor, joint_index: torch.Tensor, agent: int, num_generations: int
) -> torch.Tensor:
    """Each of an agent's K samples' return: the mean return of the joint actions it took part in.

    Args:
        joint_returns: ``[G, J]`` returns of each node's joint actions.
        joint_index: ``[J, N]`` from :func:`joint_action_indices`.
        agent: the agent.
        num_generations: K.

    Returns:
        ``[G, K]``. In aligned mode this is ``joint_returns`` itself; in cross mode, sample ``k`` of
        agent ``i`` averages the ``K^(N-1)`` joint actions that contain it (CoMLRL sums them, which
        only rescales; the mean keeps rewards on their own scale).
    """
    members = joint_index[:, agent]  # [J]
    sums = torch.zeros(joint_returns.shape[0], num_generations, dtype=joint_returns.dtype)
    sums.index_add_(1, members, joint_returns)
    counts = torch.bincount(members, minlength=num_generations).to(joint_returns.dtype)
    return sums / counts


def scale_by_std(
    advantages: list[torch.Tensor],
    scores: list[torch.Tensor],
    scale: str,
    agent_wise: bool = True,
    eps: float = 1e-4,
) -> list[torch.Tensor]:
    """Divide baseline-subtracted advantages by a standard deviation of the scores they came from.

    ``scale`` (TRL's ``scale_rewards``) says over what the std is taken, ``agent_wise`` whether each
    agent has its own (Dr. MAS, arXiv 2602.08847: one std shared by agents whose
    rewards differ in scale mis-sizes their gradients) or the team shares one:

    - ``group``: per (node, agent) (``agent_wise``; Dr. MAS's ``group_by_agent_id``; for ``shared``
      credit it equals ``group_advantages(scale="group")``) or per node over all agents' scores.
    - ``batch``: per (batch, agent) or over the whole batch (TRL's ``"batch"``, Liu et al. 2025,
      "Part I: Tricks or Traps?", arXiv 2508.08221: more robust than group std when groups are small).
    - ``none``: unchanged (Dr. GRPO, arXiv 2503.20783: std scaling up-weights near-uniform groups).

    A std of 0 gives advantage exactly 0 (never NaN). Unbiased std, as TRL.

    Args:
        advantages: N tensors ``[G, K]``.
        scores: N tensors ``[G, X]`` (the values the baseline was taken over: returns ``[G, K]``,
            counterfactual tables ``[G, K·K]``).
        scale: one of :data:`SCALE_REWARDS`.
        agent_wise: per-agent statistics (True) or the team's (False).
        eps: std floor.

    Returns:
        N tensors ``[G, K]``.

    Raises:
        ValueError: unknown ``scale``.
    """
    SCALE_REWARDS.check(scale)
    if scale == "none":
        return [a.clone() for a in advantages]

    def std(x: torch.Tensor) -> torch.Tensor:  # [G, X] -> [G, 1] (group) or [1, 1] (batch)
        x = x.float() if scale == "group" else x.float().reshape(1, -1)
        return x.std(-1, keepdim=True) if x.shape[-1] > 1 else torch.zeros_like(x[..., :1])

    stds = [std(s) for s in scores] if agent_wise else [std(torch.cat(scores, -1))] * len(scores)
    return [torch.where(sd > 0, a / (sd + eps), torch.zeros_like(a)) for a, sd in zip(advantages, stds)]
