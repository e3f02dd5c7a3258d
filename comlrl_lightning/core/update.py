"""One agent's policy-gradient update on its samples of a rollout (the math; the module steps).

:func:`prepare_agent_batch` cuts the agent's samples into micro-batches and computes, without
gradients, the log-probs the loss compares against (old policy when ``num_iterations > 1``,
reference model when ``beta > 0``); :func:`agent_backward` runs forward/backward over the
micro-batches and returns the agent's :class:`~comlrl_lightning.core.records.AgentStats`; the loss
of one micro-batch, from completion log-probs to the scalar that is backpropagated, is
:func:`agent_loss`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from comlrl_lightning.core.config import LossConfig, SamplingConfig
from comlrl_lightning.core.generation import Generation
from comlrl_lightning.core.losses import completion_logprobs, completion_logprobs_and_entropy, k3_kl
from comlrl_lightning.core.policy_loss import (
    BatchTotals,
    clipped_surrogate,
    mask_truncated,
    reduce_loss,
    sequence_kl,
)
from comlrl_lightning.core.records import AgentStats, Turn


@dataclass
class AgentBatch:
    """An agent's samples of one step, ready for the loss.

    Attributes:
        chunks: micro-batches ``(generation rows, advantages [R])``.
        masks: per chunk ``[R, C]`` the tokens the loss counts (the completion mask, without
            truncated completions when ``mask_truncated_completions``).
        old: per chunk ``[R, C]`` log-probs before the update (None when on-policy).
        ref: per chunk ``[R, C]`` reference-model log-probs (None when ``beta == 0``).
        totals: the whole batch's rows, tokens, micro-batches and ``max_completion_length`` (the
            normalisers of ``loss_type``).
        temperature: the agent's sampling temperature (the log-probs use it too).
    """

    chunks: list[tuple[Generation, torch.Tensor]]
    masks: list[torch.Tensor]
    old: list[torch.Tensor | None]
    ref: list[torch.Tensor | None]
    totals: BatchTotals
    temperature: float


@dataclass(frozen=True)
class LossTerms:
    """One micro-batch's share of an agent's loss (:func:`agent_loss`).

    Attributes:
        loss: the scalar to backpropagate.
        kl: its k3 KL term alone, ``dapo``-reduced (0.0 without a reference).
        clipped_tokens: tokens whose ratio was clipped (TRL's ``clip_ratio/region_mean`` numerator).
        low_clipped_tokens, high_clipped_tokens: of those, clipped below / above (``clip_ratio/low_*``,
            ``clip_ratio/high_*``).
    """

    loss: torch.Tensor
    kl: float
    clipped_tokens: int
    low_clipped_tokens: int = 0
    high_clipped_tokens: int = 0


def agent_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor | None,
    ref_logps: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: LossConfig,
    totals: BatchTotals,
) -> LossTerms:
    """One agent's loss on one micro-batch, from completion log-probs to the scalar backpropagated.

    Args:
        logps: ``[R, C]`` completion log-probs with gradient.
        old_logps: ``[R, C]`` log-probs before the update (None on-policy: the ratio is 1 in value).
        ref_logps: ``[R, C]`` reference-model log-probs (None: no KL term; ``kl_mode="loss"`` only).
        advantages: ``[R]``; mask: ``[R, C]`` the tokens the loss counts.
        cfg: the loss knobs; totals: the whole agent batch's normalisers.

    Returns:
        :class:`LossTerms`; the scalars of all micro-batches sum to the full-batch loss.
    """
    # ratio ρ (per token, or GSPO's sequence ratio), clipped to (1 − ε, 1 + ε_high), capped at δ:
    # ℓ = −min(min(ρ, δ)·A, clip(ρ)·A)  (PPO / DAPO clip-higher / INTELLECT-2; TRL's surrogate)
    per_token, low, high = clipped_surrogate(
        logps,
        old_logps,
        advantages.to(logps.device),
        mask,
        epsilon=cfg.epsilon,
        epsilon_high=cfg.clip_high,
        delta=cfg.delta,
        importance_sampling_level=cfg.importance_sampling_level,
    )
    kl = 0.0
    if ref_logps is not None:  # + β·k3 per token (GRPO's KL to the reference, Schulman's k3)
        k3 = k3_kl(logps, ref_logps)
        per_token = per_token + cfg.beta * k3
        kl = float(reduce_loss(k3.detach(), mask, "dapo", totals))
    # aggregation: loss_type's normaliser over the whole agent batch (grpo, dr_grpo, dapo, bnpo, sequence_sum)
    loss = reduce_loss(per_token, mask, cfg.loss_type, totals)
    m = mask.bool()
    return LossTerms(loss, kl, int(((low | high) & m).sum()), int((low & m).sum()), int((high & m).sum()))


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def prepare_agent_batch(
    model: nn.Module,
    reference: nn.Module | None,
    turns: list[Turn],
    agent: int,
    sampling: SamplingConfig,
    cfg: LossConfig,
) -> AgentBatch:
    """Agent ``agent``'s micro-batches (``cfg.micro_batch_size`` rows each, per turn) and their no-grad
    old / reference log-probs, at the agent's ``sampling.temperature`` (``sampling.max_new_tokens`` is
    ``dr_grpo``'s constant)."""
    temperature = sampling.temperature
    chunks = []
    for t in turns:
        gen, adv = t.generations[agent], t.advantages[agent]
        rows = torch.arange(len(gen.texts))
        for idx in rows.split(cfg.micro_batch_size or len(rows)):
            chunks.append((gen.rows(idx), adv[idx]))
    old: list[torch.Tensor | None] = [None] * len(chunks)
    ref: list[torch.Tensor | None] = [None] * len(chunks)
    with torch.no_grad():
        for c, (g, _) in enumerate(chunks):
            args = (g.prompt_ids, g.prompt_mask, g.completion_ids, g.completion_mask, temperature)
            if cfg.num_iterations > 1:
                old[c] = completion_logprobs(model, *args)
            if reference is not None and cfg.kl_mode == "loss":
                ref[c] = completion_logprobs(reference, *args).to(_device(model))
    masks = [
        mask_truncated(g.completion_mask, g.clipped) if cfg.mask_truncated_completions else g.completion_mask
        for g, _ in chunks
    ]
    num_rows, num_tokens = sum(len(g.texts) for g, _ in chunks), int(sum(int(m.sum()) for m in masks))
    totals = BatchTotals(num_rows, num_tokens, len(chunks), sampling.max_new_tokens)
    return AgentBatch(chunks, masks, old, ref, totals, temperature)


def agent_backward(
    model: nn.Module, batch: AgentBatch, cfg: LossConfig, backward: Callable[[torch.Tensor], None]
) -> AgentStats:
    """Forward/backward of :func:`agent_loss` over the agent's micro-batches (gradients accumulate;
    the caller zeroes them first and steps after). ``backward`` is the module's (thread-safe)
    ``manual_backward``. The entropy is logged, never optimised."""
    loss_sum = kl_sum = entropy_sum = 0.0
    clipped = low_clipped = high_clipped = 0
    for c, (g, adv) in enumerate(batch.chunks):
        mask = batch.masks[c].to(_device(model))
        logps, entropy = completion_logprobs_and_entropy(
            model, g.prompt_ids, g.prompt_mask, g.completion_ids, g.completion_mask, batch.temperature
        )
        terms = agent_loss(logps, batch.old[c], batch.ref[c], adv, mask, cfg, batch.totals)
        backward(terms.loss)
        loss_sum += float(terms.loss.detach())
        kl_sum += terms.kl
        clipped += terms.clipped_tokens
        low_clipped += terms.low_clipped_tokens
        high_clipped += terms.high_clipped_tokens
        entropy_sum += float((entropy * mask).sum())
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    grad_norm = float(torch.nn.utils.get_total_norm(grads)) if grads else 0.0
    tokens = max(batch.totals.num_tokens, 1)
    return AgentStats(
        loss=loss_sum,
        kl=kl_sum,
        clip_ratio=clipped / tokens,
        clip_ratio_low=low_clipped / tokens,
        clip_ratio_high=high_clipped / tokens,
        grad_norm=grad_norm,
        entropy=entropy_sum / tokens,
    )


@torch.no_grad()
def sequence_kls(
    model: nn.Module, reference: nn.Module, turns: list[Turn], agent: int, temperature: float
) -> list[torch.Tensor]:
    """``kl_mode="reward"``: per turn ``[G, K]`` the summed k3 KL of each of the agent's samples to the
    reference (CoMLRL ``reference_kl``), from one no-grad forward of each model per turn."""
    out = []
    for t in turns:
        g = t.generations[agent]
        args = (g.prompt_ids, g.prompt_mask, g.completion_ids, g.completion_mask, temperature)
        logps, ref = (
            completion_logprobs(model, *args),
            completion_logprobs(reference, *args).to(_device(model)),
        )
        kl = sequence_kl(logps, ref, g.completion_mask.to(logps.device))
        out.append(kl.view(len(t.nodes), -1).cpu())
    return out
