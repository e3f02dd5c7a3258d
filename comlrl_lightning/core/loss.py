"""The policy loss in one module: from an agent's completions to the scalar it backpropagates.

Every :class:`~comlrl_lightning.core.loss.LossConfig` knob is read here, and what needs a
gradient is decided here: :func:`loss_inputs` (no-grad old / reference log-probs, the mask),
:func:`micro_batch_loss` (the forward; the entropy keeps its graph only with ``entropy_coeff != 0``)
and :func:`agent_loss` (:class:`LossTerms`). A loss knob is one ``LossConfig`` field plus one
function here called from :func:`agent_loss` (:func:`entropy_bonus` for ``entropy_coeff``). Names and meanings follow TRL's ``GRPOConfig`` (``loss_type``, ``importance_sampling_level``,
``epsilon_high``, ``delta``, ``mask_truncated_completions``, the ``entropy`` metric) and verl's
``entropy_coeff``. Shapes: ``R`` rows (samples of one agent), ``P`` prompt tokens (left-padded),
``C`` completion tokens (right-padded), ``V`` vocabulary.

``loss_type`` (how per-token losses ``ℓ_{r,t}`` with mask ``m_{r,t}`` become one scalar per agent
batch; every normaliser counts the *whole agent batch*, so micro-batch shares add up):

- ``grpo`` (Shao et al. 2024, arXiv 2402.03300): ``mean_r (Σ_t m·ℓ / Σ_t m)``, each sequence's token
  mean. Bias: a token of a short completion weighs more than one of a long one, so wrong answers are
  penalised less per token the longer they get (Dr. GRPO's length bias).
- ``dr_grpo`` (Liu et al. 2025, "Understanding R1-Zero-Like Training", arXiv 2503.20783):
  ``Σ m·ℓ / (R · max_completion_length)``, a constant normaliser: no length bias; the gradient
  grows with completion length, so long completions dominate.
- ``dapo`` (Yu et al. 2025, arXiv 2503.14476): ``Σ m·ℓ / Σ m`` over every token of the agent's batch
  (TRL's default): each token weighs the same; the normaliser varies from step to step.
- ``bnpo`` (named after Xiao et al. 2025, "BNPO"; TRL's meaning is implemented): the token mean of
  each micro-batch, averaged over micro-batches (``dapo`` computed locally: the weights depend on
  how the batch is split; equal to ``dapo`` with one micro-batch).
- ``sequence_sum`` (MAGRPO paper and CoMLRL): ``mean_r Σ_t m·ℓ``, the sequence log-prob times the
  advantage: like ``dr_grpo`` without the constant; the step size scales with completion length.

The other knobs (GSPO's sequence ratio, clip-higher, ``delta``, overlong filtering, ``beta``) give
their papers under their :class:`~comlrl_lightning.core.loss.LossConfig` fields.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, replace

import torch
from torch import nn

from comlrl_lightning.core.choices import Choice
from comlrl_lightning.core.engine_correction import LogprobGap, engine_terms
from comlrl_lightning.core.generation import Generation, position_ids_from_mask
from comlrl_lightning.core.nonfinite import ON_NONFINITE
from comlrl_lightning.core.validation import require

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


LossType = LOSS_TYPE.literal
ImportanceSamplingLevel = IMPORTANCE_SAMPLING_LEVEL.literal
KLMode = KL_MODE.literal
OnNonfinite = ON_NONFINITE.literal


@dataclass
class LossConfig:
    """The per-agent update: loss aggregation, optimisation passes, ratio clipping, KL, gradients."""

    loss_type: LossType = "sequence_sum"
    """How per-token terms become a loss: one of :data:`~comlrl_lightning.core.loss.LOSS_TYPE`
    (TRL's names and meanings; papers and biases in :mod:`comlrl_lightning.core.loss`; the old
    ``sequence_mean`` / ``token_mean`` are read as ``grpo`` / ``dapo``). Formerly ``loss_aggregation``."""
    num_iterations: int = 1
    """Optimisation passes per rollout batch (> 1 uses the clipped ratio against the pre-update
    log-probs, PPO-style). TRL name."""
    epsilon: float = 0.2
    """Lower clip ε of the ratio (> 0). TRL name."""
    epsilon_high: float | None = None
    """Upper clip ε (DAPO's clip-higher), ``>= epsilon`` (a smaller one would clip the positive side
    below ``1 + epsilon``); None: ``epsilon``. TRL name."""
    delta: float | None = None
    """Two-sided clipping (INTELLECT-2, arXiv 2505.07291): the unclipped ratio is capped at ``delta``
    (> 1 + ε_high), so a negative-advantage token with a huge ratio cannot blow up the loss. None: off. TRL name."""
    importance_sampling_level: ImportanceSamplingLevel = "token"
    """One of :data:`~comlrl_lightning.core.loss.IMPORTANCE_SAMPLING_LEVEL` (pair ``sequence``
    with ``loss_type="grpo"``). Matters only off-policy (``num_iterations > 1``). TRL name."""
    mask_truncated_completions: bool = False
    """Leave completions that hit ``max_new_tokens`` without EOS out of the loss (DAPO's overlong
    filtering: their reward judges an unfinished answer). TRL name."""
    beta: float = 0.0
    """Weight of the k3 KL to a frozen reference copy of each agent (0: no reference model is kept). TRL name."""
    kl_mode: KLMode = "loss"
    """How ``beta`` applies: one of :data:`~comlrl_lightning.core.loss.KL_MODE` (``reward`` is
    CoMLRL's ``reference_kl``, so a CoMLRL config with a reference KL behaves the same; per agent with
    per-agent rewards; MAGRPO only: IAC/MAAC refuse it)."""
    entropy_coeff: float = 0.0
    """Weight ``c`` of the entropy bonus ``−c·H`` per completion token, aggregated by ``loss_type`` like
    the policy term (:func:`~comlrl_lightning.core.loss.entropy_bonus`; verl's ``entropy_coeff``, A3C's
    entropy regularisation; TRL's GRPO has none). 0 (default): no bonus, the loss bit for bit as
    without it, and the entropy is only logged (no gradient through it). Any real number; > 0 rewards
    a spread-out policy."""
    max_grad_norm: float | None = 1.0
    """Per-agent gradient-norm clip; None: off. TRL name."""
    micro_batch_size: int | None = None
    """Samples per forward/backward (gradients accumulate into one step per agent); None: all at once.
    With ``loss_type="bnpo"`` the gradient depends on it (warned at construction)."""
    vllm_importance_sampling_correction: bool = False
    """Truncated importance sampling (TIS; Yao et al. 2025, "Your efficient RL framework secretly brings
    you off-policy RL training"; verl's TIS, TRL's ``vllm_importance_sampling_correction``): with
    ``generation_backend="vllm"``, each completion token's loss is weighted by
    ``min(π_trainer / π_engine, vllm_importance_sampling_cap)``, correcting for the engine sampling from
    a slightly different distribution than the trainer scores. Off by default (TRL turns it on); a
    no-op on the HF backends, whose sampler is the trainer's model. TRL name."""
    vllm_importance_sampling_cap: float = 2.0
    """The truncation ``C`` of the TIS weight (>= 1; 1 clips every weight at 1). TRL's name and default."""
    on_nonfinite: OnNonfinite = "skip"
    """An agent whose loss or gradients are not finite (NaN/inf) before its optimizer step: one of
    :data:`~comlrl_lightning.core.nonfinite.ON_NONFINITE`. Either way no non-finite weights are saved."""

    def __post_init__(self) -> None:
        self.loss_type = LOSS_TYPE.canonical(self.loss_type)
        require("num_iterations", self.num_iterations, self.num_iterations >= 1, ">= 1")
        require("epsilon", self.epsilon, self.epsilon > 0, "> 0")
        high_ok = self.epsilon_high is None or self.epsilon_high >= self.epsilon
        require("epsilon_high", self.epsilon_high, high_ok, f">= epsilon = {self.epsilon} or None")
        require("beta", self.beta, self.beta >= 0, ">= 0")
        coeff_ok = isinstance(self.entropy_coeff, int | float) and math.isfinite(self.entropy_coeff)
        require("entropy_coeff", self.entropy_coeff, coeff_ok, "a finite number")
        delta_ok = self.delta is None or self.delta > 1 + self.clip_high
        require("delta", self.delta, delta_ok, f"> 1 + epsilon_high = {1 + self.clip_high} or None")
        IMPORTANCE_SAMPLING_LEVEL.check(self.importance_sampling_level)
        KL_MODE.check(self.kl_mode)
        ON_NONFINITE.check(self.on_nonfinite)
        tis_ok = isinstance(self.vllm_importance_sampling_correction, bool)
        require(
            "vllm_importance_sampling_correction",
            self.vllm_importance_sampling_correction,
            tis_ok,
            "true or false",
        )
        cap_ok = self.vllm_importance_sampling_cap >= 1
        require("vllm_importance_sampling_cap", self.vllm_importance_sampling_cap, cap_ok, ">= 1")
        mb_ok = self.micro_batch_size is None or self.micro_batch_size >= 1
        require("micro_batch_size", self.micro_batch_size, mb_ok, ">= 1 or None")
        if self.loss_type == "bnpo" and self.micro_batch_size is not None:
            mb = f"loss_type='bnpo' with micro_batch_size={self.micro_batch_size}"
            why = "bnpo normalises by each micro-batch's tokens, so the gradient changes with it; 'dapo' does not"
            warnings.warn(f"{mb}: {why}", UserWarning, stacklevel=2)

    @property
    def clip_high(self) -> float:
        """The upper clip ε in use."""
        return self.epsilon if self.epsilon_high is None else self.epsilon_high

    def engine_correction_cap(self) -> float | None:
        """The truncated importance-sampling cap when ``vllm_importance_sampling_correction`` is on, else
        None (what :func:`~comlrl_lightning.core.engine_correction.engine_terms` takes)."""
        return self.vllm_importance_sampling_cap if self.vllm_importance_sampling_correction else None

    def max_steps_for(self, num_batches: int, num_agents: int) -> int:
        """``trainer.max_steps`` that trains ``num_batches`` batches: Lightning counts every optimizer
        step, and one batch steps each of the N agents ``num_iterations`` times."""
        return num_batches * num_agents * self.num_iterations


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


# ---------------------------------------------------------------- log-probs and entropy (the forward)
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


def logprobs_and_entropy(
    logits: torch.Tensor, index: torch.Tensor, chunk_rows: int = 8, entropy_grad: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """``log_softmax(logits)[index]`` and the entropy of each position's distribution, ``chunk_rows``
    rows at a time, so no float32 full-vocabulary copy of all rows is held (without ``entropy_grad``).

    ``H = logsumexp(l) − Σ_v softmax(l)_v · l_v`` (one logsumexp per position serves both outputs).
    Same numbers as TRL's ``selective_log_softmax`` and ``entropy_from_logits``.

    Args: logits ``[R, C, V]`` (already divided by the temperature); index ``[R, C]``; chunk_rows:
    rows per chunk; entropy_grad: keep the entropy's graph (a loss term); False: a metric only.
    Returns: ``(logps [R, C], entropy [R, C])`` float32.
    """
    logps, entropy = [], []
    for lg, ix in zip(logits.split(chunk_rows), index.split(chunk_rows)):
        lse = torch.logsumexp(lg.float(), dim=-1)
        logps.append(lg.gather(-1, ix.unsqueeze(-1)).squeeze(-1).float() - lse)
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            probs = torch.softmax(lg.float(), dim=-1)
            entropy.append((lse if entropy_grad else lse.detach()) - (probs * lg.float()).sum(-1))
    return torch.cat(logps), torch.cat(entropy)


def _completion_logits(
    model: nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
    completion_mask: torch.Tensor, temperature: float,
) -> torch.Tensor:  # fmt: skip
    """``[R, C, V]`` logits (divided by ``temperature``) at the positions that predict each completion token."""
    device = next(model.parameters()).device
    # the last completion token predicts nothing we score: leave it out of the forward
    input_ids = torch.cat([prompt_ids, completion_ids[:, :-1]], 1).to(device)
    attn = torch.cat([prompt_mask, completion_mask[:, :-1]], 1).to(device)
    positions, keep = position_ids_from_mask(attn), completion_ids.shape[1]
    logits = model(
        input_ids=input_ids, attention_mask=attn, position_ids=positions, logits_to_keep=keep, use_cache=False
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

    Args: prompt_ids, prompt_mask ``[R, P]`` left-padded prompts; completion_ids, completion_mask
    ``[R, C]`` (mask 1 up to and including EOS); temperature: the sampling temperature (> 0).
    Returns: ``[R, C]`` float32 log-probs, 0 where ``completion_mask`` is 0.
    """
    logits = _completion_logits(model, prompt_ids, prompt_mask, completion_ids, completion_mask, temperature)
    logps = selective_log_softmax(logits, completion_ids.to(logits.device))
    return logps * completion_mask.to(logits.device)


# ---------------------------------------------------------------- per-token terms
def k3_kl(logps: torch.Tensor, ref_logps: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(π‖π_ref): ``exp(r) − r − 1`` with ``r = logπ_ref − logπ`` (Schulman 2020)."""
    r = ref_logps - logps
    return torch.exp(r) - r - 1


def sequence_kl(logps: torch.Tensor, ref_logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-sample k3 KL to the reference summed over completion tokens (CoMLRL ``reference_kl``):
    ``Σ_t m·(exp(r) − r − 1)``, ``r = logπ_ref − logπ``. Args ``[R, C]``; returns ``[R]``."""
    return (k3_kl(logps, ref_logps) * mask.to(logps.dtype)).sum(-1)


def log_importance_weights(
    logps: torch.Tensor, old_logps: torch.Tensor, mask: torch.Tensor, level: str
) -> torch.Tensor:
    """``log ρ`` per token: ``logπ − logπ_old`` (``token``) or GSPO's sequence value
    ``Σ_t m·(logπ − logπ_old) / Σ_t m`` repeated on every token (``sequence``).

    Args: logps, old_logps, mask ``[R, C]``; level: one of :data:`IMPORTANCE_SAMPLING_LEVEL`.
    Returns: ``[R, C]``. Raises: ValueError for an unknown ``level``.
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

    Args: logps ``[R, C]`` with gradient; old_logps ``[R, C]`` or None; advantages ``[R]``; mask
    ``[R, C]`` (for the sequence ratio); epsilon, epsilon_high: lower/upper clip (None: ``epsilon``);
    delta: cap of the unclipped ratio (None: off); importance_sampling_level: :data:`IMPORTANCE_SAMPLING_LEVEL`.
    Returns: ``(loss [R, C], low_clipped [R, C], high_clipped [R, C])``, the flags unmasked: TRL's
    ``clip_ratio/low_*`` (``ρ < 1−ε``, ``A < 0``) and ``clip_ratio/high_*`` (``ρ > 1+ε_high``, ``A > 0``).
    """
    eps_high = epsilon if epsilon_high is None else epsilon_high
    old = logps.detach() if old_logps is None else old_logps
    ratio = torch.exp(log_importance_weights(logps, old, mask, importance_sampling_level))
    clipped = ratio.clamp(1 - epsilon, 1 + eps_high)
    capped = ratio if delta is None else ratio.clamp(max=delta)
    adv = advantages[:, None].to(logps.dtype)
    loss = -torch.min(capped * adv, clipped * adv)
    return loss, (ratio < 1 - epsilon) & (adv < 0), (ratio > 1 + eps_high) & (adv > 0)


def entropy_bonus(entropy: torch.Tensor, entropy_coeff: float) -> torch.Tensor:
    """Per-token entropy bonus ``−c·H_t`` (verl's ``entropy_coeff``; A3C's entropy regularisation,
    Mnih et al. 2016): added to ``ℓ`` before ``loss_type``'s aggregation, so it is normalised like the
    policy term and a higher entropy lowers the loss. Args: entropy ``[R, C]`` with gradient. Returns ``[R, C]``."""
    return -entropy_coeff * entropy


def reduce_loss(
    per_token: torch.Tensor, mask: torch.Tensor, loss_type: str, totals: BatchTotals
) -> torch.Tensor:
    """A micro-batch's share of the agent's scalar loss under ``loss_type`` (module docstring).

    Args: per_token ``[R, C]`` this micro-batch's per-token losses; mask ``[R, C]`` (without
    truncated rows where masked); loss_type: one of :data:`LOSS_TYPE`; totals: the whole batch's.
    Returns: a scalar; summed over the micro-batches it gives the batch loss.
    Raises: ValueError for an unknown ``loss_type``.
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
    Args: completion_mask ``[R, C]``; truncated ``[R]`` bool. Returns ``[R, C]``."""
    return completion_mask * (~truncated.bool()).to(completion_mask.dtype)[:, None]


@torch.no_grad()
def loss_inputs(
    model: nn.Module, reference: nn.Module | None, gen: Generation, cfg: LossConfig, temperature: float
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor]:
    """What one micro-batch's loss compares against, decided from ``cfg``, without gradients:
    ``(old, ref, mask)``, ``old [R, C]`` the policy's log-probs before the update (``num_iterations > 1``
    only: on-policy the ratio is 1), ``ref [R, C]`` the reference model's (a ``reference``, ``beta > 0``,
    ``kl_mode="loss"`` only), each else None; ``mask [R, C]`` the tokens the loss counts."""
    args = (gen.prompt_ids, gen.prompt_mask, gen.completion_ids, gen.completion_mask, temperature)
    old = completion_logprobs(model, *args) if cfg.num_iterations > 1 else None
    ref = None
    if reference is not None and cfg.beta > 0 and cfg.kl_mode == "loss":
        ref = completion_logprobs(reference, *args).to(next(model.parameters()).device)
    truncated = cfg.mask_truncated_completions
    return old, ref, mask_truncated(gen.completion_mask, gen.clipped) if truncated else gen.completion_mask


# ---------------------------------------------------------------- one micro-batch's loss
@dataclass(frozen=True)
class LossTerms:
    """One micro-batch's share of an agent's loss (:func:`agent_loss`).
    Attributes:
        loss: the scalar to backpropagate.
        kl: its k3 KL term alone, ``dapo``-reduced (0.0 without a reference).
        clipped_tokens: tokens whose ratio was clipped (TRL's ``clip_ratio/region_mean`` numerator).
        low_clipped_tokens, high_clipped_tokens: of those, clipped below / above (``clip_ratio/low_*``,
            ``clip_ratio/high_*``).
        entropy_sum: the policy entropy summed over the counted tokens (nats; 0.0 when not given).
        engine_gap: the engine/trainer log-prob gap of the rows (None: not sampled by an engine).
    """

    loss: torch.Tensor
    kl: float
    clipped_tokens: int
    low_clipped_tokens: int = 0
    high_clipped_tokens: int = 0
    entropy_sum: float = 0.0
    engine_gap: LogprobGap | None = None


def agent_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor | None,
    ref_logps: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: LossConfig,
    totals: BatchTotals,
    entropy: torch.Tensor | None = None,
    is_weights: torch.Tensor | None = None,
) -> LossTerms:
    """One agent's loss on one micro-batch, from completion log-probs to the scalar backpropagated.

    Args:
        logps: ``[R, C]`` with gradient; old_logps: ``[R, C]`` before the update (None on-policy: the
            ratio is 1 in value); ref_logps: ``[R, C]`` reference model's (None: no KL term).
        advantages: ``[R]``; mask: ``[R, C]`` the tokens the loss counts.
        cfg: the loss knobs; totals: the whole agent batch's normalisers.
        entropy: ``[R, C]`` (with gradient when ``cfg.entropy_coeff != 0``); None: not logged.
        is_weights: ``[R, C]`` TIS weights of the policy term (engine rollouts with
            ``vllm_importance_sampling_correction``; :mod:`~comlrl_lightning.core.engine_correction`).

    Returns: :class:`LossTerms`; the scalars of all micro-batches sum to the full-batch loss.
    Raises: ValueError: ``cfg.entropy_coeff != 0`` without ``entropy``.
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
    if is_weights is not None:  # × min(π_trainer/π_engine, C) before the KL, as TRL and verl weight it
        per_token = per_token * is_weights
    kl = 0.0
    if ref_logps is not None:  # + β·k3 per token (GRPO's KL to the reference, Schulman's k3)
        k3 = k3_kl(logps, ref_logps)
        per_token = per_token + cfg.beta * k3
        kl = float(reduce_loss(k3.detach(), mask, "dapo", totals))
    if cfg.entropy_coeff != 0:  # − c·H per token (skipped at 0, so the default loss is unchanged bit for bit)
        if entropy is None:
            raise ValueError(f"entropy_coeff: got {cfg.entropy_coeff!r}, but agent_loss was given no entropy")
        per_token = per_token + entropy_bonus(entropy, cfg.entropy_coeff)
    # aggregation: loss_type's normaliser over the whole agent batch (grpo, dr_grpo, dapo, bnpo, sequence_sum)
    loss = reduce_loss(per_token, mask, cfg.loss_type, totals)
    m = mask.bool()
    h = 0.0 if entropy is None else float((entropy.detach() * m).sum())
    return LossTerms(loss, kl, int(((low | high) & m).sum()), int((low & m).sum()), int((high & m).sum()), h)


def micro_batch_loss(
    model: nn.Module,
    gen: Generation,
    old_logps: torch.Tensor | None,
    ref_logps: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: LossConfig,
    totals: BatchTotals,
    temperature: float,
) -> LossTerms:
    """The forward of one micro-batch (``gen``'s ``R`` rows; log-probs and TRL's ``entropy`` metric
    from the same logits, :func:`logprobs_and_entropy`) and its :func:`agent_loss`; the entropy has a
    gradient only when ``cfg.entropy_coeff != 0``.

    Args: as :func:`agent_loss`; ``gen`` the rows; ``temperature`` the agent's sampling temperature.
    """
    args = (gen.prompt_ids, gen.prompt_mask, gen.completion_ids, gen.completion_mask, temperature)
    logits = _completion_logits(model, *args)
    index, completion_mask = gen.completion_ids.to(logits.device), gen.completion_mask.to(logits.device)
    logps, entropy = logprobs_and_entropy(logits, index, entropy_grad=cfg.entropy_coeff != 0)
    logps, entropy = logps * completion_mask, entropy * completion_mask
    gap, weights = engine_terms(
        logps, old_logps, gen.engine_logprobs, completion_mask, cfg.engine_correction_cap()
    )
    terms = agent_loss(logps, old_logps, ref_logps, advantages, mask, cfg, totals, entropy, weights)
    return terms if gap is None else replace(terms, engine_gap=gap)
