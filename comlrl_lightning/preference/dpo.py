"""The joint DPO loss of a team (MADPO; CoMLRL ``madpo.py`` ``_agent_preference_loss``).

A joint action's probability is the product of the agents' (each writes its own completion), so a
pair's joint log-ratio is a sum over agents: with agent i's winner-minus-loser sequence log-prob

    Δ_i = [log π_i(c_i) − log π_i(r_i)] − [log π_ref,i(c_i) − log π_ref,i(r_i)]

(DPO proper, Rafailov et al. 2023; ``reference_free``: the bracket with the reference is 0, CoMLRL's
form) the joint margin is ``z = Σ_i Δ_i``, and agent i's loss is ``ℓ(β · (Δ_i + Σ_{j≠i} sg(Δ_j)))``
(``sg``: stop-gradient): every agent's loss has the joint value, but each agent's gradient flows only
through its own Δ. ``ℓ`` is TRL's ``loss_type`` (:data:`DPO_LOSS_TYPE`).

Sequence log-probs are sums of per-token log-probs under ``logits / temperature`` (the sampling
temperature, as the policy losses here; CoMLRL scores ``logits`` at temperature 1 whatever it sampled
at), every completion token counted, the EOS included (CoMLRL drops the last token). ``ipo`` uses
the per-token mean instead of the sum, as TRL's IPO does (the IPO target ``1/(2β)`` is on that scale).

Shapes: ``P`` pairs, ``N`` agents.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from comlrl_lightning.core import metrics as M
from comlrl_lightning.core.choices import Choice
from comlrl_lightning.core.nonfinite import ON_NONFINITE

DPO_LOSS_TYPE = Choice(
    "preference.loss_type",
    {
        "sigmoid": "−log σ(β·z), with `label_smoothing` ε: −(1−ε)·log σ(β·z) − ε·log σ(−β·z) (DPO; "
        "cDPO with ε > 0; CoMLRL's loss)",
        "ipo": "(z − 1/(2β))², z from per-token mean log-probs (IPO, Azar et al. 2023; TRL's `ipo`)",
        "hinge": "max(0, 1 − β·z) (SLiC, Zhao et al. 2023; TRL's `hinge`)",
    },
)
"""TRL's ``DPOConfig.loss_type`` values that apply to a joint margin ``z = Σ_i Δ_i``."""

PREFERENCE_MODE = Choice(
    "preference_mode",
    {
        "one_shot": "CoMLRL's MADPO: every pair is built once from the initial policy (all training "
        "prompts, at the first step), then `num_train_epochs` shuffled passes over them, one update "
        "per `train_batch_size` pairs (the pair set is saved in checkpoints)",
        "online": "each training batch's pairs are built from the current policy and trained on in one "
        "update (on-policy preferences; `num_train_epochs` and `train_batch_size` unused)",
    },
)
"""Where MADPO's pairs come from and how often they are rebuilt."""

DPOLossType = DPO_LOSS_TYPE.literal
PreferenceMode = PREFERENCE_MODE.literal
OnNonfinite = ON_NONFINITE.literal


@dataclass
class DPOConfig:
    """The joint DPO update of :class:`~comlrl_lightning.preference.madpo.MADPO` (TRL's ``DPOConfig``
    names where they apply, CoMLRL's for the multi-agent knobs).

    Raises:
        ValueError: a value out of range or not allowed, naming the field, the value and what is allowed.
    """

    dpo_beta: float = 0.1
    """β of the DPO loss (> 0): the inverse temperature of the implied reward. CoMLRL name (TRL: ``beta``)."""
    loss_type: DPOLossType = "sigmoid"
    """One of :data:`DPO_LOSS_TYPE`. TRL name."""
    label_smoothing: float = 0.0
    """Probability ε in [0, 0.5) that a label is flipped (cDPO); ``sigmoid`` only. TRL name."""
    reference_free: bool = False
    """False (default): DPO proper, a frozen reference copy of each agent enters Δ_i (placed like a
    critic: ``reference_devices``). True: no reference model, Δ_i is the policy's log-ratio alone
    (CoMLRL's MADPO). TRL name."""
    preference_mode: PreferenceMode = "one_shot"
    """One of :data:`PREFERENCE_MODE`."""
    num_train_epochs: int = 20
    """``one_shot``: passes over the pair set (>= 1). CoMLRL name and default. Another value with
    ``online`` is ignored, with a warning naming it."""
    train_batch_size: int = 2
    """``one_shot``: pairs per update (>= 1). CoMLRL name (its default is ``rollout_buffer_size`` = 2).
    Another value with ``online`` is ignored, with a warning naming it."""
    micro_batch_size: int | None = None
    """Pairs per forward/backward (gradients accumulate into one step per agent); None: all at once."""
    max_grad_norm: float | None = 1.0
    """Per-agent gradient-norm clip (> 0); None: off (CoMLRL clips nothing). TRL name."""
    on_nonfinite: OnNonfinite = "skip"
    """An agent whose loss or gradients are NaN/inf: one of :data:`~comlrl_lightning.core.nonfinite.ON_NONFINITE`
    (CoMLRL instead returns a constant loss of 0.1 and steps)."""

    def __post_init__(self) -> None:
        def need(field: str, value: object, ok: bool, allowed: str) -> None:
            if not ok:
                raise ValueError(f"{field}: got {value!r}, must be {allowed}")

        need("dpo_beta", self.dpo_beta, _number(self.dpo_beta) and self.dpo_beta > 0, "> 0")
        DPO_LOSS_TYPE.check(self.loss_type)
        ls = self.label_smoothing
        need("label_smoothing", ls, _number(ls) and 0 <= ls < 0.5, "in [0, 0.5)")
        if ls and self.loss_type != "sigmoid":
            need(
                "label_smoothing", ls, False, f"0 with loss_type={self.loss_type!r} (it applies to 'sigmoid')"
            )
        need("reference_free", self.reference_free, isinstance(self.reference_free, bool), "true or false")
        PREFERENCE_MODE.check(self.preference_mode)
        for name in ("num_train_epochs", "train_batch_size"):
            v = getattr(self, name)
            need(name, v, isinstance(v, int) and not isinstance(v, bool) and v >= 1, "an integer >= 1")
            if self.preference_mode == "online" and v != type(self).__dataclass_fields__[name].default:
                warnings.warn(f"dpo.{name}: got {v!r}, which preference_mode='online' ignores (each batch's "
                              "pairs are trained on in one update; it applies to 'one_shot')", stacklevel=2)  # fmt: skip
                # stacklevel 2: the dataclass's own __init__, one place for every copy of the config
                # (jsonargparse builds it, the module copies it): one line per field, not one per copy
        mb = self.micro_batch_size
        need("micro_batch_size", mb, mb is None or (isinstance(mb, int) and mb >= 1), ">= 1 or None")
        g = self.max_grad_norm
        need("max_grad_norm", g, g is None or (_number(g) and g > 0), "> 0 or None")
        ON_NONFINITE.check(self.on_nonfinite)


def _number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x and abs(x) != float("inf")


def joint_dpo_losses(
    own: torch.Tensor,
    others: torch.Tensor,
    beta: float,
    loss_type: str = "sigmoid",
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """Per-pair loss of one agent: ``ℓ(β · (own + others))`` with gradient through ``own`` only.

    Args:
        own: ``[P]`` the agent's Δ_i (with gradient).
        others: ``[P]`` ``Σ_{j≠i} Δ_j`` (detached here whatever it carries).
        beta: ``dpo_beta`` (> 0).
        loss_type: one of :data:`DPO_LOSS_TYPE`.
        label_smoothing: ε in [0, 0.5) (``sigmoid`` only).

    Returns:
        ``[P]`` losses (the agent's loss is their mean).

    Raises:
        ValueError: an unknown ``loss_type``, or ``label_smoothing`` > 0 with a loss other than ``sigmoid``.
    """
    DPO_LOSS_TYPE.check(loss_type)
    z = own + others.detach().to(own)
    if loss_type == "sigmoid":
        return -(1 - label_smoothing) * F.logsigmoid(beta * z) - label_smoothing * F.logsigmoid(-beta * z)
    if label_smoothing:
        raise ValueError(f"label_smoothing: got {label_smoothing!r}, applies to loss_type='sigmoid' only")
    if loss_type == "ipo":
        return (z - 1 / (2 * beta)) ** 2
    return torch.relu(1 - beta * z)


def sequence_logps(token_logps: torch.Tensor, mask: torch.Tensor, mean: bool = False) -> torch.Tensor:
    """``[R]`` sequence log-prob: the sum of ``token_logps [R, C]`` over ``mask [R, C]`` (``mean``:
    divided by the row's token count, at least 1)."""
    m = mask.to(token_logps)
    total = (token_logps * m).sum(-1)
    return total / m.sum(-1).clamp(min=1) if mean else total


@dataclass(frozen=True)
class PairLogps:
    """Sequence log-probs of ``P`` pairs for every agent (no gradient).

    Attributes:
        chosen: ``[N, P]`` log π_i of each agent's completion in the chosen joint action.
        rejected: ``[N, P]`` the same in the rejected one.
        ref_chosen: ``[N, P]`` the reference models' (zeros when ``reference_free``).
        ref_rejected: ``[N, P]``.
    """

    chosen: torch.Tensor
    rejected: torch.Tensor
    ref_chosen: torch.Tensor
    ref_rejected: torch.Tensor

    @property
    def deltas(self) -> torch.Tensor:
        """``[N, P]`` every agent's Δ_i."""
        return (self.chosen - self.rejected) - (self.ref_chosen - self.ref_rejected)

    def others(self, agent: int) -> torch.Tensor:
        """``[P]`` ``Σ_{j≠agent} Δ_j``."""
        d = self.deltas
        return d.sum(0) - d[agent]


def dpo_metrics(logps: PairLogps, beta: float) -> dict[str, float]:
    """TRL's DPO metrics of the joint action (each a Σ over agents, then a mean over pairs):

    - ``rewards/chosen``: ``β·Σ_i (log π_i(c_i) − log π_ref,i(c_i))``; ``rewards/rejected`` likewise;
    - ``rewards/margins``: chosen minus rejected (``β·z``); ``rewards/accuracies``: fraction with margin > 0;
    - ``logps/chosen``, ``logps/rejected``: ``Σ_i log π_i`` (the joint action's log-prob);
    - ``agent_<i>/rewards/margins``: ``β·Δ_i`` (agent i's share of the margin).

    Computed from the no-grad log-probs of the step, before any agent steps (TRL logs the same forward
    the loss uses). With ``reference_free`` the reference terms are 0 (TRL's ``reference_free``).
    """
    chosen = beta * (logps.chosen - logps.ref_chosen).sum(0)
    rejected = beta * (logps.rejected - logps.ref_rejected).sum(0)
    margins = chosen - rejected
    out = {
        M.DPO_CHOSEN: float(chosen.mean()),
        M.DPO_REJECTED: float(rejected.mean()),
        M.DPO_MARGINS: float(margins.mean()),
        M.DPO_ACCURACIES: float((margins > 0).float().mean()),
        M.DPO_LOGPS_CHOSEN: float(logps.chosen.sum(0).mean()),
        M.DPO_LOGPS_REJECTED: float(logps.rejected.sum(0).mean()),
    }
    for i, d in enumerate(logps.deltas):
        out[M.agent(i, M.DPO_MARGINS)] = float(beta * d.mean())
    return out
