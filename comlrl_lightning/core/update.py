"""One agent's policy-gradient update on its samples of a rollout (the batching; the module steps).

:func:`prepare_agent_batch` cuts the agent's samples into micro-batches and computes, without
gradients, the log-probs the loss compares against (old policy when ``num_iterations > 1``,
reference model when ``beta > 0``); :func:`agent_backward` runs forward/backward over the
micro-batches and returns the agent's :class:`~comlrl_lightning.core.records.AgentStats`. The loss
of one micro-batch, from the forward to the scalar that is backpropagated, is
:func:`~comlrl_lightning.core.loss.micro_batch_loss` (all of it in :mod:`comlrl_lightning.core.loss`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from comlrl_lightning.core.config import SamplingConfig
from comlrl_lightning.core.engine_correction import LogprobGap
from comlrl_lightning.core.generation import Generation
from comlrl_lightning.core.loss import (
    BatchTotals,
    LossConfig,
    completion_logprobs,
    loss_inputs,
    micro_batch_loss,
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
    """Agent ``agent``'s micro-batches (``cfg.micro_batch_size`` rows each, per turn) and what each one's
    loss compares against (:func:`~comlrl_lightning.core.loss.loss_inputs`: no-grad old / reference
    log-probs and the loss mask), at the agent's ``sampling.temperature`` (``sampling.max_new_tokens``
    is ``dr_grpo``'s constant)."""
    temperature = sampling.temperature
    chunks = []
    for t in turns:
        gen, adv = t.generations[agent], t.advantages[agent]
        rows = torch.arange(len(gen.texts))
        for idx in rows.split(cfg.micro_batch_size or len(rows)):
            chunks.append((gen.rows(idx), adv[idx]))
    # what each micro-batch's loss compares against is the loss module's call (old / reference log-probs, mask)
    inputs = [loss_inputs(model, reference, g, cfg, temperature) for g, _ in chunks]
    old, ref, masks = [i[0] for i in inputs], [i[1] for i in inputs], [i[2] for i in inputs]
    num_rows, num_tokens = sum(len(g.texts) for g, _ in chunks), int(sum(int(m.sum()) for m in masks))
    totals = BatchTotals(num_rows, num_tokens, len(chunks), sampling.max_new_tokens)
    return AgentBatch(chunks, masks, old, ref, totals, temperature)


def agent_backward(
    model: nn.Module, batch: AgentBatch, cfg: LossConfig, backward: Callable[[torch.Tensor], None]
) -> AgentStats:
    """Forward/backward of :func:`~comlrl_lightning.core.loss.micro_batch_loss` over the agent's micro-batches (gradients accumulate;
    the caller zeroes them first and steps after). ``backward`` is the module's (thread-safe)
    ``manual_backward``. The loss itself, entropy included, is :func:`~comlrl_lightning.core.loss.micro_batch_loss`'s."""
    loss_sum = kl_sum = entropy_sum = 0.0
    clipped = low_clipped = high_clipped = 0
    gap: LogprobGap | None = None
    for c, (g, adv) in enumerate(batch.chunks):
        mask = batch.masks[c].to(_device(model))
        terms = micro_batch_loss(
            model, g, batch.old[c], batch.ref[c], adv, mask, cfg, batch.totals, batch.temperature
        )
        backward(terms.loss)
        loss_sum += float(terms.loss.detach())
        kl_sum += terms.kl
        clipped += terms.clipped_tokens
        low_clipped += terms.low_clipped_tokens
        high_clipped += terms.high_clipped_tokens
        entropy_sum += terms.entropy_sum
        if terms.engine_gap is not None:
            gap = terms.engine_gap if gap is None else gap + terms.engine_gap
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
        engine_gap=gap,
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
