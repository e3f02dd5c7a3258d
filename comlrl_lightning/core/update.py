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
from comlrl_lightning.core.losses import aggregate, completion_logprobs, k3_kl, policy_loss_terms
from comlrl_lightning.core.records import AgentStats, Turn


@dataclass
class AgentBatch:
    """An agent's samples of one step, ready for the loss.

    Attributes:
        chunks: micro-batches ``(generation rows, advantages [R])``.
        old: per chunk ``[R, C]`` log-probs before the update (None when on-policy).
        ref: per chunk ``[R, C]`` reference-model log-probs (None when ``beta == 0``).
        num_rows: samples over all chunks.
        num_tokens: completion tokens over all chunks.
    """

    chunks: list[tuple[Generation, torch.Tensor]]
    old: list[torch.Tensor | None]
    ref: list[torch.Tensor | None]
    num_rows: int
    num_tokens: int


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def prepare_agent_batch(
    model: nn.Module, reference: nn.Module | None, turns: list[Turn], agent: int, temperature: float, cfg: LossConfig
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
            if reference is not None:
                ref[c] = completion_logprobs(reference, *args).to(_device(model))
    return AgentBatch(chunks, old, ref, num_rows=sum(len(g.texts) for g, _ in chunks),
                      num_tokens=int(sum(int(g.completion_mask.sum()) for g, _ in chunks)))  # fmt: skip


def agent_backward(
    model: nn.Module, batch: AgentBatch, temperature: float, cfg: LossConfig, backward: Callable[[torch.Tensor], None]
) -> AgentStats:
    """Forward/backward over the agent's micro-batches (gradients accumulate; the caller zeroes them
    first and steps after). ``backward`` is the module's (thread-safe) ``manual_backward``.

    Per micro-batch: per-token terms ``-A·ratio`` clipped at ``(1-ε, 1+ε_high)`` (PPO; the ratio is 1
    on-policy), ``+ β·k3`` KL (Schulman's k3 estimator), aggregated by ``cfg.loss_type`` with the
    step's totals as denominators, so the micro-batch losses sum to the full-batch loss.
    """
    loss_sum = kl_sum = clipped_sum = 0.0
    for c, (g, adv) in enumerate(batch.chunks):
        mask = g.completion_mask.to(_device(model))
        logps = completion_logprobs(model, g.prompt_ids, g.prompt_mask, g.completion_ids, g.completion_mask, temperature)
        per_tok, clipped = policy_loss_terms(logps, batch.old[c], adv.to(logps.device), cfg.epsilon, cfg.clip_high)
        if batch.ref[c] is not None:
            kl = k3_kl(logps, batch.ref[c])
            per_tok = per_tok + cfg.beta * kl
            kl_sum += float(aggregate(kl.detach(), mask, "token_mean", batch.num_rows, batch.num_tokens))
        loss = aggregate(per_tok, mask, cfg.aggregation, batch.num_rows, batch.num_tokens)
        backward(loss)
        loss_sum += float(loss.detach())
        clipped_sum += float((clipped & mask.bool()).sum())
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    grad_norm = float(torch.nn.utils.get_total_norm(grads)) if grads else 0.0
    return AgentStats(loss=loss_sum, kl=kl_sum, clip_ratio=clipped_sum / max(batch.num_tokens, 1), grad_norm=grad_norm)
