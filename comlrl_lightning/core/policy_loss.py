"""TRL's policy-loss vocabulary: the clipped surrogate with token- or sequence-level importance
sampling, two-sided clipping, truncation masking, the ``loss_type`` normalisations, and entropy.

Shapes: ``R`` rows (samples of one agent), ``C`` completion tokens (right-padded), ``V`` vocabulary.
Names and meanings follow TRL's ``GRPOConfig`` (``loss_type``, ``importance_sampling_level``,
``epsilon_high``, ``delta``, ``mask_truncated_completions``, the ``entropy`` metric).

``loss_type`` (how per-token losses ``ℓ_{r,t}`` with mask ``m_{r,t}`` become one scalar per agent
batch; every normaliser counts the *whole agent batch*, so micro-batch shares add up):

- ``grpo`` (Shao et al. 2024, arXiv 2402.03300): ``mean_r (Σ_t m·ℓ / Σ_t m)``, each sequence's token
  mean. Bias: a token of a short completion weighs more than one of a long one, so wrong answers are
  penalised less per token the longer they get (Dr. GRPO's length bias).
- ``dr_grpo`` (Liu et al. 2025, "Understanding R1-Zero-Like Training", arXiv 2503.20783):
  ``Σ m·ℓ / (R · max_completion_length)``, a constant normaliser: no length bias; the gradient
  grows with completion length, so long completions dominate.
- ``dapo`` (Yu et al. 2025, arXiv 2503.14476): ``Σ m·ℓ / Σ m`` over every token of the agent's batch
  (TRL's default): each token weighs the same; the normaliser (the batch's token count) varies from
  step to step.
- ``bnpo`` (named after Xiao et al. 2025, "BNPO: Beta Normalization Policy Optimization"; TRL's
  meaning is implemented): the token mean of each micro-batch,
  averaged over micro-batches: ``dapo`` computed locally, so the weights depend on how the batch is
  split (equal to ``dapo`` with one micro-batch).
- ``sequence_sum`` (MAGRPO paper and CoMLRL): ``mean_r Σ_t m·ℓ``, the sequence log-prob times the
  advantage: like ``dr_grpo`` without the constant; the step size scales with completion length.

``importance_sampling_level``: ``token`` (PPO/GRPO, ``ρ_t = π/π_old`` per token) or ``sequence``
(GSPO, Zheng et al. 2025, arXiv 2507.18071: ``s = exp(mean_t log(π/π_old))``, one length-normalised
ratio per sequence shared by its tokens; clipping then keeps or drops whole sequences, which is
stabler for long completions and MoE models). GSPO's objective is per sequence: pair it with
``loss_type="grpo"``; the token-summing types weight each sequence by its length (TRL warns alike). ``epsilon_high`` (DAPO "clip-higher") raises the upper
clip so low-probability tokens can grow; ``delta`` (INTELLECT-2, arXiv 2505.07291) caps the
unclipped ratio from above, so a negative-advantage token with a huge ratio cannot blow up the loss.
``mask_truncated_completions`` (DAPO's overlong filtering) drops completions that hit the length
limit without EOS from the loss: their reward judges an unfinished answer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from comlrl_lightning.core.choices import Choice

LOSS_TYPE = Choice(
    "loss_type",
    {
        "sequence_sum": "sum over a completion's tokens, mean over completions (the MAGRPO paper's code, CoMLRL)",
        "grpo": "mean per completion, then over completions (Shao et al. 2024; length-biased)",
        "dr_grpo": "token sum over `completions × max_new_tokens` (Dr. GRPO, Liu et al. 2025)",
        "dapo": "mean over every token of the agent's batch (Yu et al. 2025; TRL's default)",
        "bnpo": "token mean per micro-batch, averaged over micro-batches (TRL's meaning)",
    },
    aliases={"sequence_mean": "grpo", "token_mean": "dapo"},
)
"""How per-token terms become one agent's scalar loss (TRL ``loss_type``; the module docstring has
the formulas and biases; the aliases are the pre-TRL ``loss_aggregation`` names)."""

IMPORTANCE_SAMPLING_LEVEL = Choice(
    "importance_sampling_level",
    {
        "token": "one ratio per token (PPO, GRPO)",
        "sequence": "GSPO's length-normalised sequence ratio (Zheng et al. 2025, arXiv 2507.18071)",
    },
)
"""Where the importance ratio is taken (TRL ``importance_sampling_level``)."""

KL_MODE = Choice(
    "kl_mode",
    {
        "loss": "`+β·k3` per token in the loss (GRPO paper, TRL)",
        "reward": "each sample's return minus `β·Σ_t k3` before the baseline (CoMLRL's `reference_kl`; "
        "one no-grad policy forward per agent and turn at rollout time)",
    },
)
"""How ``beta``'s KL to the reference applies: per-token loss term, or :func:`sequence_kl` as a
per-sample cost in the advantage (no direct gradient)."""


@dataclass(frozen=True)
class BatchTotals:
    """Totals over one agent's whole update batch, so each micro-batch's loss is its exact share.

    Attributes:
        num_rows: samples in the agent's batch.
        num_tokens: unmasked completion tokens in the agent's batch.
        num_micro_batches: micro-batches the batch is split into (``bnpo`` averages over them).
        max_completion_length: the generation limit in tokens (``dr_grpo``'s constant).
    """

    num_rows: int
    num_tokens: int
    num_micro_batches: int = 1
    max_completion_length: int = 1


def log_importance_weights(
    logps: torch.Tensor, old_logps: torch.Tensor, mask: torch.Tensor, level: str
) -> torch.Tensor:
    """``log ρ`` per token: ``logπ − logπ_old`` (``token``) or GSPO's sequence value
    ``Σ_t m·(logπ − logπ_old) / Σ_t m`` repeated on every token (``sequence``).

    Args:
        logps, old_logps, mask: ``[R, C]``.
        level: one of :data:`IMPORTANCE_SAMPLING_LEVEL`.

    Returns:
        ``[R, C]``.

    Raises:
        ValueError: unknown ``level``.
    """
    log_ratio = logps - old_logps
    if level == "token":
        return log_ratio
    if level == "sequence":
        m = mask.to(log_ratio.dtype)
        seq = (log_ratio * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1.0)
        return seq.expand_as(log_ratio)
    raise ValueError(
        f"importance_sampling_level: got {level!r}, allowed: {list(IMPORTANCE_SAMPLING_LEVEL.names)}"
    )


def clipped_surrogate(
    logps: torch.Tensor,
    old_logps: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    delta: float | None = None,
    importance_sampling_level: str = "token",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token clipped policy loss, as TRL's ``GRPOTrainer._compute_loss``.

    ``ℓ = −min(ρ'·A, clip(ρ, 1−ε, 1+ε_high)·A)`` with ``ρ' = min(ρ, δ)`` when ``delta`` is set. With
    ``old_logps=None`` (on-policy) ``ρ = exp(logπ − sg(logπ)) = 1`` in value and the gradient is
    REINFORCE's ``−A·∇logπ`` (GSPO: ``−A·∇ mean_t logπ``).

    Args:
        logps: ``[R, C]`` with gradient; old_logps: ``[R, C]`` or None; advantages: ``[R]``;
        mask: ``[R, C]`` (used by the sequence-level ratio).
        epsilon, epsilon_high: lower/upper clip (``epsilon_high=None``: ``epsilon``).
        delta: upper cap of the unclipped ratio (None: off; must be > 1 + ε_high to matter).
        importance_sampling_level: one of :data:`IMPORTANCE_SAMPLING_LEVEL`.

    Returns:
        ``(loss [R, C], low_clipped [R, C] bool, high_clipped [R, C] bool)``: the clip flags are TRL's
        ``clip_ratio/low_*`` (``ρ < 1−ε`` and ``A < 0``) and ``clip_ratio/high_*`` (``ρ > 1+ε_high``
        and ``A > 0``), unmasked.
    """
    eps_high = epsilon if epsilon_high is None else epsilon_high
    old = logps.detach() if old_logps is None else old_logps
    ratio = torch.exp(log_importance_weights(logps, old, mask, importance_sampling_level))
    clipped = ratio.clamp(1 - epsilon, 1 + eps_high)
    capped = ratio if delta is None else ratio.clamp(max=delta)
    adv = advantages[:, None].to(logps.dtype)
    loss = -torch.min(capped * adv, clipped * adv)
    return loss, (ratio < 1 - epsilon) & (adv < 0), (ratio > 1 + eps_high) & (adv > 0)


def reduce_loss(
    per_token: torch.Tensor, mask: torch.Tensor, loss_type: str, totals: BatchTotals
) -> torch.Tensor:
    """A micro-batch's share of the agent's scalar loss under ``loss_type`` (module docstring).

    Args:
        per_token: ``[R, C]`` per-token losses of this micro-batch.
        mask: ``[R, C]`` completion mask (already without truncated rows where masked).
        loss_type: one of :data:`LOSS_TYPE`.
        totals: the whole agent batch's :class:`BatchTotals`.

    Returns:
        Scalar; summing it over the micro-batches gives the batch loss.

    Raises:
        ValueError: unknown ``loss_type``.
    """
    m = mask.to(per_token.dtype)
    masked = per_token * m
    if loss_type == "grpo":
        return (masked.sum(-1) / m.sum(-1).clamp(min=1.0)).sum() / max(totals.num_rows, 1)
    if loss_type == "dr_grpo":
        return masked.sum() / (max(totals.num_rows, 1) * totals.max_completion_length)
    if loss_type == "dapo":
        return masked.sum() / max(totals.num_tokens, 1)
    if loss_type == "bnpo":
        return masked.sum() / m.sum().clamp(min=1.0) / totals.num_micro_batches
    if loss_type == "sequence_sum":
        return masked.sum() / max(totals.num_rows, 1)
    raise ValueError(f"loss_type: got {loss_type!r}, allowed: {list(LOSS_TYPE.names)}")


def mask_truncated(completion_mask: torch.Tensor, truncated: torch.Tensor) -> torch.Tensor:
    """``mask_truncated_completions``: zero the rows of completions that ended without EOS.

    Args: completion_mask ``[R, C]``; truncated ``[R]`` bool. Returns ``[R, C]``.
    """
    return completion_mask * (~truncated.bool()).to(completion_mask.dtype)[:, None]


def logprobs_and_entropy(
    logits: torch.Tensor, index: torch.Tensor, chunk_rows: int = 8
) -> tuple[torch.Tensor, torch.Tensor]:
    """``log_softmax(logits)[index]`` and the entropy of each position's distribution, ``chunk_rows``
    rows at a time, so no float32 full-vocabulary copy of all rows is ever held.

    ``H = logsumexp(l) − Σ_v softmax(l)_v · l_v`` (one logsumexp per position serves both outputs).
    Same numbers as TRL's ``selective_log_softmax`` and ``entropy_from_logits``.

    Args:
        logits: ``[R, C, V]`` (already divided by the temperature); index: ``[R, C]``.
        chunk_rows: rows per chunk.

    Returns:
        ``(logps [R, C], entropy [R, C])`` float32; entropy has no gradient (it is a metric).
    """
    logps, entropy = [], []
    for lg, ix in zip(logits.split(chunk_rows), index.split(chunk_rows)):
        lse = torch.logsumexp(lg.float(), dim=-1)
        logps.append(lg.gather(-1, ix.unsqueeze(-1)).squeeze(-1).float() - lse)
        with torch.no_grad():
            probs = torch.softmax(lg.float(), dim=-1)
            entropy.append(lse.detach() - (probs * lg.float()).sum(-1))
    return torch.cat(logps), torch.cat(entropy)


def sequence_kl(logps: torch.Tensor, ref_logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-sample k3 KL to the reference summed over completion tokens (CoMLRL ``reference_kl``):
    ``Σ_t m·(exp(r) − r − 1)``, ``r = logπ_ref − logπ``. Args ``[R, C]``; returns ``[R]``."""
    r = ref_logps - logps
    return ((torch.exp(r) - r - 1) * mask.to(r.dtype)).sum(-1)
