"""Per-token log-probabilities of completions (the policy loss itself is in ``policy_loss.py``).

Shapes: ``R`` rows (samples), ``P`` prompt tokens (left-padded), ``C`` completion tokens
(right-padded), ``V`` vocabulary.
"""

from __future__ import annotations

import torch
from torch import nn

from comlrl_lightning.core.generation import position_ids_from_mask
from comlrl_lightning.core.policy_loss import logprobs_and_entropy


def selective_log_softmax(logits: torch.Tensor, index: torch.Tensor, chunk_rows: int = 8) -> torch.Tensor:
    """``log_softmax(logits)[..., index]`` without keeping a full-vocabulary log-softmax.

    ``logit[index] − logsumexp(logits)``, computed ``chunk_rows`` rows at a time (same trick as TRL's
    ``selective_log_softmax``). Args: ``logits [R, C, V]``, ``index [R, C]``. Returns ``[R, C]``.
    """
    out = []
    for lg, ix in zip(logits.split(chunk_rows), index.split(chunk_rows)):
        picked = lg.gather(-1, ix.unsqueeze(-1)).squeeze(-1)
        out.append(picked.float() - torch.logsumexp(lg.float(), dim=-1))
    return torch.cat(out)


def _completion_logits(
    model: nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    temperature: float,
) -> torch.Tensor:
    """``[R, C, V]`` logits (divided by ``temperature``) at the positions that predict each completion token."""
    device = next(model.parameters()).device
    # the last completion token predicts nothing we score: leave it out of the forward
    input_ids = torch.cat([prompt_ids, completion_ids[:, :-1]], 1).to(device)
    attn = torch.cat([prompt_mask, completion_mask[:, :-1]], 1).to(device)
    c = completion_ids.shape[1]
    logits = model(
        input_ids=input_ids,
        attention_mask=attn,
        position_ids=position_ids_from_mask(attn),
        logits_to_keep=c,
        use_cache=False,
    ).logits
    return logits / temperature if temperature != 1.0 else logits


def completion_logprobs(
    model: nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Per-token log π(completion token | prefix) under ``logits / temperature``.

    One forward over ``prompt ⊕ completion[:-1]``; only the last ``C`` positions' logits are made
    (``logits_to_keep``). Every completion token is scored, the EOS included (CoMLRL drops the last
    token; that is fixed here). Padding gets 0.

    Args:
        prompt_ids, prompt_mask: ``[R, P]`` left-padded prompts.
        completion_ids, completion_mask: ``[R, C]``; mask 1 up to and including EOS.
        temperature: the sampling temperature (> 0).

    Returns:
        ``[R, C]`` float32 log-probs, 0 where ``completion_mask`` is 0.
    """
    logits = _completion_logits(model, prompt_ids, prompt_mask, completion_ids, completion_mask, temperature)
    logps = selective_log_softmax(logits, completion_ids.to(logits.device))
    return logps * completion_mask.to(logits.device)


def completion_logprobs_and_entropy(
    model: nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`completion_logprobs` plus each position's policy entropy (TRL's ``entropy`` metric),
    from the same forward, chunked (``policy_loss.logprobs_and_entropy``).

    Returns:
        ``(logps [R, C], entropy [R, C])`` float32, both 0 where ``completion_mask`` is 0; the
        entropy carries no gradient.
    """
    logits = _completion_logits(model, prompt_ids, prompt_mask, completion_ids, completion_mask, temperature)
    mask = completion_mask.to(logits.device)
    logps, entropy = logprobs_and_entropy(logits, completion_ids.to(logits.device))
    return logps * mask, entropy * mask


def k3_kl(logps: torch.Tensor, ref_logps: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(π‖π_ref): ``exp(r) − r − 1`` with ``r = logπ_ref − logπ`` (Schulman 2020)."""
    r = ref_logps - logps
    return torch.exp(r) - r - 1
