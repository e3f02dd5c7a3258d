"""`GradientCheckpointing`: activation checkpointing on every agent for the training forwards."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from torch import nn


class GradientCheckpointing(pl.Callback):
    """Turns on Hugging Face activation (gradient) checkpointing for every agent at fit start.

    Each decoder layer's activations are recomputed in the backward pass instead of being kept from
    the forward: activation memory drops from O(layers) to O(1) layers per agent, for about one
    extra forward per update. Gradients are unchanged (non-reentrant ``torch.utils.checkpoint``
    replays the forward with the same RNG state, so dropout masks match).

    Generation is unaffected: HF only checkpoints modules in training mode with gradients enabled,
    while MAGRPO generates in ``eval()`` under ``inference_mode`` with ``use_cache=True``; its
    log-prob forwards pass ``use_cache=False``. ``config.use_cache`` is left as it was (restored if
    a transformers version changes it), so generation keeps its KV cache.

    Runs in ``on_fit_start``: MAGRPO builds its agents in ``configure_model``, which runs after
    ``Callback.setup``. Idempotent: agents already checkpointing (another stage, a second call,
    shared-weight agents) are skipped.

    Args:
        use_reentrant: passed to ``torch.utils.checkpoint``; ``False`` (default) also works when the
            embeddings are frozen (LoRA). With ``True``, ``enable_input_require_grads`` is called.

    Raises:
        ValueError: an agent whose model does not support activation checkpointing (names the agent).
    """

    def __init__(self, use_reentrant: bool = False) -> None:
        super().__init__()
        self.use_reentrant = use_reentrant

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        enable_gradient_checkpointing(getattr(pl_module, "agents", ()), self.use_reentrant)


def enable_gradient_checkpointing(models: Any, use_reentrant: bool = False) -> int:
    """Enable activation checkpointing on each distinct model in ``models``.

    Args:
        models: an iterable of Hugging Face ``PreTrainedModel`` (an ``nn.ModuleList`` of agents).
        use_reentrant: see :class:`GradientCheckpointing`.

    Returns:
        How many models were newly switched on (0 when all already were).

    Raises:
        ValueError: a model without ``supports_gradient_checkpointing``.
    """
    seen: set[int] = set()
    switched = 0
    for i, model in enumerate(models):
        if id(model) in seen:
            continue
        seen.add(id(model))
        if not getattr(model, "supports_gradient_checkpointing", False):
            raise ValueError(
                f"GradientCheckpointing: agent {i} ({type(model).__name__}) does not support "
                "activation checkpointing"
            )
        if is_gradient_checkpointing(model):
            continue
        config = getattr(model, "config", None)
        use_cache = getattr(config, "use_cache", None)
        kwargs = {"use_reentrant": use_reentrant}
        if hasattr(model, "activation_checkpointing_enable"):  # transformers ≥ 5.x name
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        if use_reentrant and not hasattr(model, "_require_grads_hook"):  # HF may have added the hook already
            model.enable_input_require_grads()
        if config is not None and use_cache is not None:
            config.use_cache = use_cache
        switched += 1
    return switched


def is_gradient_checkpointing(model: nn.Module) -> bool:
    """Whether HF activation checkpointing is on for ``model`` (any module flag set)."""
    return any(bool(getattr(m, "gradient_checkpointing", False)) for m in model.modules())
