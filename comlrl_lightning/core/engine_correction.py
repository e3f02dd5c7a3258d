"""Engine/trainer mismatch: how far an inference engine's log-probs are from the trainer's, and the
truncated importance-sampling (TIS) weight that corrects the loss for it.

An inference engine (``generation_backend="vllm"``) samples completions with its own kernels, so the
probability it gave a token, ``π_engine``, differs slightly from the one the trainer computes for the
same token, ``π_trainer`` (fp32 here: ~1e-5 in log space; bf16 on a GPU: much more). The loss is
always computed from the trainer's log-probs; these functions measure the gap and, when
``LossConfig.vllm_importance_sampling_correction`` is on, reweight each token by
``min(π_trainer / π_engine, C)`` (Yao et al. 2025, "Your efficient RL framework secretly brings you
off-policy RL training"; verl's TIS, TRL's ``vllm_importance_sampling_correction`` with
``vllm_importance_sampling_cap``).

Shapes: ``R`` rows (one agent's samples), ``C`` completion tokens (right-padded).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LogprobGap:
    """``|log π_trainer − log π_engine|`` over the counted completion tokens of some rows.

    Attributes:
        abs_sum: sum of the gaps (nats), for a mean over several micro-batches.
        abs_max: the largest gap (nats); 0.0 for no tokens.
        tokens: how many tokens were compared.
    """

    abs_sum: float = 0.0
    abs_max: float = 0.0
    tokens: int = 0

    def __add__(self, other: LogprobGap) -> LogprobGap:
        return LogprobGap(
            self.abs_sum + other.abs_sum, max(self.abs_max, other.abs_max), self.tokens + other.tokens
        )

    @property
    def mean(self) -> float:
        """The mean gap per token (nats); 0.0 for no tokens."""
        return self.abs_sum / self.tokens if self.tokens else 0.0


def logprob_gap(trainer_logps: torch.Tensor, engine_logps: torch.Tensor, mask: torch.Tensor) -> LogprobGap:
    """The engine/trainer gap of the tokens in ``mask``.

    Args: trainer_logps, engine_logps ``[R, C]`` (log-probs of the same tokens under the same
    temperature); mask ``[R, C]`` 1 for the tokens to compare (padding 0).
    Returns: :class:`LogprobGap`.
    Raises: ValueError: the shapes differ.
    """
    if trainer_logps.shape != engine_logps.shape:
        raise ValueError(
            f"logprob_gap: trainer log-probs {tuple(trainer_logps.shape)} and engine log-probs "
            f"{tuple(engine_logps.shape)} must have one shape"
        )
    m = mask.bool()
    gap = (trainer_logps.detach().float() - engine_logps.to(trainer_logps.device).float()).abs()[m]
    if gap.numel() == 0:
        return LogprobGap()
    return LogprobGap(float(gap.sum()), float(gap.max()), int(gap.numel()))


def truncated_importance_weights(
    trainer_logps: torch.Tensor, engine_logps: torch.Tensor, mask: torch.Tensor, cap: float
) -> torch.Tensor:
    """Per-token TIS weights ``min(exp(log π_trainer − log π_engine), cap)`` (no gradient), 0 on padding.

    ``trainer_logps`` are the log-probs of the policy that the loss's ratio is taken against (the
    current one on-policy, the pre-update one with ``num_iterations > 1``), detached: the weight
    rescales the gradient, it is not differentiated (TRL, verl).

    Args: trainer_logps, engine_logps, mask ``[R, C]``; cap: the truncation ``C`` (>= 1).
    Returns: ``[R, C]`` float32 weights in ``[0, cap]``.
    Raises: ValueError: ``cap < 1``.
    """
    if cap < 1:
        raise ValueError(f"vllm_importance_sampling_cap: got {cap!r}, must be >= 1")
    log_ratio = trainer_logps.detach().float() - engine_logps.to(trainer_logps.device).float()
    return torch.exp(log_ratio).clamp(max=cap) * mask.to(log_ratio.device, torch.float32)


def engine_terms(
    logps: torch.Tensor,
    old_logps: torch.Tensor | None,
    engine_logps: torch.Tensor | None,
    mask: torch.Tensor,
    cap: float | None,
) -> tuple[LogprobGap | None, torch.Tensor | None]:
    """What one micro-batch's loss takes from an engine's log-probs: ``(gap, TIS weights)``.

    The trainer side is the policy the ratio is taken against: ``old_logps`` when given
    (``num_iterations > 1``), else ``logps`` (on-policy, the current weights, which sampled the batch).

    Args: logps ``[R, C]`` the trainer's (with or without gradient); old_logps ``[R, C]`` or None;
    engine_logps ``[R, C]`` or None (not sampled by an engine); mask ``[R, C]`` the completion tokens;
    cap: the TIS cap, or None for no correction
    (:meth:`~comlrl_lightning.core.loss.LossConfig.engine_correction_cap`).
    Returns: ``(None, None)`` without ``engine_logps``; else the gap and, with a ``cap``, the ``[R, C]``
    weights (else None).
    """
    if engine_logps is None:
        return None, None
    trainer = (logps if old_logps is None else old_logps).detach()
    gap = logprob_gap(trainer, engine_logps, mask)
    if cap is None:
        return gap, None
    return gap, truncated_importance_weights(trainer, engine_logps, mask, cap)
