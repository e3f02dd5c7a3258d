"""What happens to an optimizer step whose loss or gradients are not finite (``on_nonfinite``).

The module calls :func:`nonfinite_verdict` right before each agent's or critic's optimizer step;
no non-finite value is ever stepped into or saved (checkpoints check the weights too).
"""

from __future__ import annotations

import math

import torch

from comlrl_lightning.core.choices import Choice

ON_NONFINITE = Choice(
    "on_nonfinite",
    {
        "skip": "no step for that agent this pass: its gradients are dropped and the count is logged as "
        "`z_agent_<i>/skipped_steps` (the skipped step still counts in `global_step`, so checkpoint cadence "
        "and `max_steps` are unchanged; the LR scheduler does not step for it)",
        "stop": "raise `FloatingPointError` naming the agent and batch",
    },
)
"""An agent (or critic) whose loss or gradients are NaN/inf before its optimizer step."""


def gradients_finite(optimizer: torch.optim.Optimizer, loss: float | None) -> tuple[bool, float]:
    """``(finite, grad_norm)``: whether ``loss`` (None: not checked) and every gradient of
    ``optimizer``'s parameters are finite, and the gradients' total norm (NaN/inf iff any entry is)."""
    grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    grad_norm = float(torch.nn.utils.get_total_norm(grads)) if grads else 0.0
    return math.isfinite(grad_norm) and (loss is None or math.isfinite(loss)), grad_norm


def nonfinite_verdict(what: str, on_nonfinite: str) -> str:
    """The warning for a skipped step, or raises for ``stop``.

    Args:
        what: the fault, naming its owner and the batch (``"agent 1: non-finite loss ... at ..."``).
        on_nonfinite: one of :data:`ON_NONFINITE`.

    Raises:
        FloatingPointError: ``on_nonfinite="stop"``.
    """
    ON_NONFINITE.check(on_nonfinite)
    if on_nonfinite == "stop":
        raise FloatingPointError(f"{what}; stopping (LossConfig.on_nonfinite='stop'; 'skip' skips the step)")
    return f"{what}; its optimizer step is skipped (LossConfig.on_nonfinite='skip')"
