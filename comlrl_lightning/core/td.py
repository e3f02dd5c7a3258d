"""Temporal-difference targets, critic advantages and the value loss (IAC, MAAC).

On the rollout tree (see :mod:`comlrl_lightning.core.rollout`) joint action ``j`` of node ``g`` at
turn ``t`` has reward ``r_t`` and, unless its branch ended, one child node at turn ``t + 1``:

    T_t = r_t + discount · mean(V(h_{t+1}))        (the child node's values; last turn: T_t = r_t)

The mean runs over the child node's value entries: one ``V(h)`` per sample for a V-critic (all
equal), one ``Q(h, a)`` per sample or joint action for a Q-critic, so with ``K > 1`` children the
target uses their mean, as MAGRPO's returns use the mean of the child returns. With ``K = 1`` this
is CoMLRL's ``target_t = r_t + γ·V_old(h_{t+1})`` (``ac_base.py``). Values are the critic's outputs
from before the update (no gradient).

Advantage ``A = T − b`` with ``b`` the critic's value (:func:`td_advantages`). For a Q-critic,
``T − Q(h, a)`` is the TD error of ``Q`` itself, zero in expectation for every action; so ``b`` is
the mean of ``Q`` over the node's ``K`` sibling samples (an estimate of ``V(h)``) and equals CoMLRL's
``T − Q(h, a)`` only when ``K = 1`` (:func:`critic_baseline`).

A joint action whose branch ended *solved* before the last turn (``stop_reward``,
``termination_threshold`` or a transition that returns ``SOLVED``) enters an absorbing solved state:
the team keeps its answer and is paid the same reward every remaining turn,

    R_t = r_t · Σ_{s=0}^{T−1−t} discount^s                (:func:`absorbing_rewards`)

which is also its TD target (the absorbing state's value needs no critic). So solving early never
ranks below solving later with the same reward, nor below any continuation whose per-turn rewards
stay at or below ``r_t``. ``rollout.solved_return="reward"`` keeps CoMLRL's ``R_t = r_t``.

Shapes: ``G`` nodes of a turn, ``J`` joint actions per node, ``K`` samples per agent per node,
``M`` value entries per node (``K`` for one agent's critic, ``J`` for a centralised Q-critic).
"""

from __future__ import annotations

import torch

from comlrl_lightning.core.choices import Choice

SOLVED_RETURN = Choice(
    "solved_return",
    {
        "absorbing": "the solved state is absorbing, paying the same reward each remaining turn, "
        "`R_t = r_t · Σ_{s=0}^{T−1−t} discount^s` (also the IAC/MAAC TD target)",
        "reward": "`R_t = r_t` (CoMLRL; a branch solved at turn 0 can then rank below one that continues)",
    },
)
"""Return of a joint action whose branch ended solved before the last turn."""

CRITIC_TYPE = Choice(
    "critic_type",
    {
        "v": "`V(h)` read at the last prompt token (the history alone)",
        "q": "`Q(h, a)` read at the last completion token (history and action; TD baseline: the sibling mean)",
    },
)
"""What a critic estimates and where it reads it (:func:`~comlrl_lightning.core.value_head.read_positions`;
its baseline: :func:`critic_baseline`)."""


def absorbing_factor(turns_left: int, discount: float) -> float:
    """``Σ_{s=0}^{turns_left} discount^s``: the return of an absorbing state paying 1 per turn, this
    turn and ``turns_left`` more (``turns_left + 1`` when ``discount == 1``)."""
    return float(sum(discount**s for s in range(turns_left + 1)))


def absorbing_rewards(
    rewards: torch.Tensor, solved: torch.Tensor | None, turns_left: int, discount: float
) -> torch.Tensor:
    """Rewards with every solved joint action's replaced by its absorbing return (module docstring).

    Args:
        rewards: ``[G, J]`` (or ``[G, J, N]`` per agent, or ``[G, M]`` scored) immediate rewards.
        solved: bool, ``rewards``' first two dims: True where the branch ended solved; None: none did.
        turns_left: turns after this one up to ``num_turns``.
        discount: γ.

    Returns:
        float32, ``rewards``' shape: ``r · absorbing_factor(turns_left, discount)`` where solved, else ``r``.
    """
    out = rewards.float().clone()
    if solved is None or turns_left <= 0 or not bool(solved.any()):
        return out
    out[solved] *= absorbing_factor(turns_left, discount)
    return out


def td_targets(
    rewards: torch.Tensor, child: torch.Tensor, next_values: torch.Tensor | None, discount: float
) -> torch.Tensor:
    """One turn's TD targets ``T = r + discount · mean(next node's values)`` (``T = r`` where the branch ended).

    Args:
        rewards: ``[G, J]`` rewards of the turn's joint actions (shared, or one agent's column).
        child: ``[G, J]`` long, index of each joint action's child node in the next turn, −1 where none.
        next_values: ``[G_next, M]`` critic values at the next turn's nodes (no grad); None on the last turn.
        discount: γ in [0, 1].

    Returns:
        ``[G, J]`` float32 targets.

    Raises:
        ValueError: a joint action has a child but ``next_values`` is None, or has too few rows.
    """
    targets = rewards.float().clone()
    has_child = child >= 0
    if not has_child.any():
        return targets
    if next_values is None:
        raise ValueError("td_targets: some joint actions have a child node but next_values is None")
    if int(child.max()) >= next_values.shape[0]:
        raise ValueError(
            f"td_targets: child index {int(child.max())} but next_values has {next_values.shape[0]} rows"
        )
    child_mean = next_values.detach().float().to(targets.device).mean(-1)  # [G_next]
    targets[has_child] += discount * child_mean[child[has_child]]
    return targets


def critic_baseline(values: torch.Tensor, critic_type: str) -> torch.Tensor:
    """The baseline subtracted from the TD target: ``V(h)`` itself, or the sibling mean of ``Q(h, ·)``.

    Args:
        values: ``[G, K]`` critic values of one agent's ``K`` samples per node (or ``[G, J]`` joint values).
        critic_type: ``"v"`` or ``"q"``.

    Returns:
        ``[G, K]`` baselines (for ``"q"`` every entry of a row is the row mean).

    Raises:
        ValueError: unknown ``critic_type``.
    """
    if critic_type == "v":
        return values
    if critic_type == "q":
        return values.mean(-1, keepdim=True).expand_as(values)
    raise ValueError(f"critic_type: got {critic_type!r}, allowed: {list(CRITIC_TYPE.names)}")


def normalize_advantages(advantages: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``(A − mean) / (std + eps)`` over all entries (population std; CoMLRL normalises each
    agent × turn group this way). One entry, or all equal, gives the centred values unscaled."""
    if advantages.numel() <= 1:
        return advantages
    centred = advantages - advantages.mean()
    std = advantages.std(unbiased=False)
    return centred / (std + eps) if std > 0 else centred


def td_advantages(
    targets: torch.Tensor, baselines: torch.Tensor, normalize: bool = False, eps: float = 1e-6
) -> torch.Tensor:
    """``A = T − b``, optionally normalised (see :func:`normalize_advantages`).

    Args:
        targets: ``[...]`` TD targets; baselines: same shape (no grad).
        normalize: CoMLRL ``advantage_normalization``.
        eps: std floor of the normalisation.

    Returns:
        float32 advantages, same shape.
    """
    adv = targets.float() - baselines.detach().float().to(targets.device)
    return normalize_advantages(adv, eps) if normalize else adv


def value_loss(
    values: torch.Tensor,
    targets: torch.Tensor,
    old_values: torch.Tensor | None = None,
    clip_range: float | None = None,
    coef: float = 1.0,
) -> torch.Tensor:
    """``coef · mean((V − T)²)``, or the clipped form ``coef · mean(max((V − T)², (V_clip − T)²))``
    with ``V_clip = V_old + clip(V − V_old, −ε, ε)`` (PPO's value clipping; CoMLRL ``value_clip_range``
    and ``value_loss_coef``, no ½ factor, as CoMLRL).

    Args:
        values: ``[R]`` current values (with grad).
        targets: ``[R]`` TD targets (no grad).
        old_values: ``[R]`` values from before the update; needed when ``clip_range`` is set.
        clip_range: ε > 0, or None for no clipping.
        coef: ``value_loss_coef``.

    Returns:
        A scalar loss.

    Raises:
        ValueError: ``clip_range`` set without ``old_values``, or ``clip_range <= 0``.
    """
    targets = targets.detach().to(values.device, values.dtype)
    loss = (values - targets).pow(2)
    if clip_range is not None:
        if clip_range <= 0:
            raise ValueError(f"value_clip_range: got {clip_range}, must be > 0 or None")
        if old_values is None:
            raise ValueError("value_loss: value_clip_range needs old_values (the values before the update)")
        old = old_values.detach().to(values.device, values.dtype)
        clipped = old + (values - old).clamp(-clip_range, clip_range)
        loss = torch.maximum(loss, (clipped - targets).pow(2))
    return coef * loss.mean()


def explained_variance(values: torch.Tensor, targets: torch.Tensor) -> float:
    """``1 − Var(T − V) / Var(T)`` (1: perfect critic, 0: no better than a constant, < 0: worse).

    Returns NaN when the targets have no variance (undefined; Stable-Baselines3 does the same).
    """
    targets, values = targets.detach().float().flatten(), values.detach().float().flatten().to(targets.device)
    var = targets.var(unbiased=False)
    if targets.numel() < 2 or var == 0:
        return float("nan")
    return float(1 - (targets - values).var(unbiased=False) / var)
