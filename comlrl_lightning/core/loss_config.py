"""The per-agent update's knobs: :class:`LossConfig`, the ``loss`` group of every policy-gradient
algorithm (``model.init_args.loss`` in YAML). Read by :mod:`comlrl_lightning.core.loss` (the loss
itself) and :mod:`comlrl_lightning.core.update` (micro-batches, passes); each enumerated knob's values
are declared next to the code that implements them (``LOSS_TYPE``, ``IMPORTANCE_SAMPLING_LEVEL``,
``KL_MODE`` in ``core/loss.py``, ``ON_NONFINITE`` in ``core/nonfinite.py``).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

from comlrl_lightning.core.loss import IMPORTANCE_SAMPLING_LEVEL, KL_MODE, LOSS_TYPE
from comlrl_lightning.core.nonfinite import ON_NONFINITE
from comlrl_lightning.core.validation import require

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

    def max_steps_for(self, num_batches: int, num_agents: int) -> int:
        """``trainer.max_steps`` that trains ``num_batches`` batches: Lightning counts every optimizer
        step, and one batch steps each of the N agents ``num_iterations`` times."""
        return num_batches * num_agents * self.num_iterations
