"""One agent's policy-gradient update on its samples of a rollout (the math; the module steps).

:func:`prepare_agent_batch` cuts the agent's samples into micro-batches and computes, without
gradients, the log-probs the loss compares against (old policy when ``num_iterations > 1``,
reference model when ``beta > 0``); :func:`agent_backward` runs forward/backward over the
micro-batches and returns the agent's :class:`~comlrl_lightning.core.records.AgentStats`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from comlrl_lightning.core.config import LossConfig
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
        num_rows: samples over all chunks.
        num_tokens: completion tokens over all chunks.
    """

    chunks: list[tuple[Generation, torch.Tensor]]
    masks: list[torch.Tensor]
    old: list[torch.Tensor | None]
    ref: list[torch.Tensor | None]
    num_rows: int
    num_tokens: int


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def prepare_agent_batch(
    model: nn.Module,
    reference: nn.Module | None,
    turns: list[Turn],
    agent: int,
    temperature: float,
    cfg: LossConfig,
) -> AgentBatch:
    """Agent ``agent``'s micro-batches (``cfg.micro_batch_size`` rows each, per turn) and their no-grad
    old / reference log-probs."""
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
    return AgentBatch(
        chunks,
        masks,
        old,
        ref,
        num_rows=sum(len(g.texts) for g, _ in chunks),
        num_tokens=int(sum(int(m.sum()) for m in masks)),
    )


def agent_backward(
    model: nn.Module,
    batch: AgentBatch,
    temperature: float,
    cfg: LossConfig,
    backward: Callable[[torch.Tensor], None],
    max_completion_length: int = 1,
) -> AgentStats:
    """Forward/backward over the agent's micro-batches (gradients accumulate; the caller zeroes them
    first and steps after). ``backward`` is the module's (thread-safe) ``manual_backward``.

    Per micro-batch: TRL's clipped surrogate (:func:`~comlrl_lightning.core.policy_loss.clipped_surrogate`:
    token or sequence ratio, ``(1-ε, 1+ε_high)``, ``delta``; the ratio is 1 on-policy), ``+ β·k3`` KL
    when ``kl_mode="loss"``, reduced by ``cfg.loss_type`` with the whole agent batch's totals
    (``max_completion_length`` in tokens for ``dr_grpo``), so the micro-batch losses sum to the
    full-batch loss. The entropy is logged, never optimised.
    """
    totals = BatchTotals(batch.num_rows, batch.num_tokens, len(batch.chunks), max_completion_length)
    loss_sum = kl_sum = clipped_sum = entropy_sum = 0.0
    for c, (g, adv) in enumerate(batch.chunks):
        mask = batch.masks[c].to(_device(model))
        logps, entropy = completion_logprobs_and_entropy(
            model, g.prompt_ids, g.prompt_mask, g.completion_ids, g.completion_mask, temperature
        )
        per_tok, low, high = clipped_surrogate(
            logps,
            batch.old[c],
            adv.to(logps.device),
            mask,
            cfg.epsilon,
            cfg.clip_high,
            cfg.delta,
            cfg.importance_sampling_level,
        )
        if batch.ref[c] is not None:
            kl = k3_kl(logps, batch.ref[c])
            per_tok = per_tok + cfg.beta * kl
            kl_sum += float(reduce_loss(kl.detach(), mask, "dapo", totals))
        loss = reduce_loss(per_tok, mask, cfg.loss_type, totals)
        backward(loss)
        loss_sum += float(loss.detach())
        clipped_sum += float(((low | high) & mask.bool()).sum())
        entropy_sum += float((entropy * mask).sum())
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    grad_norm = float(torch.nn.utils.get_total_norm(grads)) if grads else 0.0
    tokens = max(batch.num_tokens, 1)
    return AgentStats(
        loss=loss_sum,
        kl=kl_sum,
        clip_ratio=clipped_sum / tokens,
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
