"""Progress bars without the run-version column and with a sane epoch count.

Lightning's bars show ``v_num`` (the logger's version, already in the log folder's name; the rich
bar prints it as ``v_num: 0.000``) and the rich bar's description is ``Epoch e/<max_epochs - 1>``,
which reads ``Epoch 1/-2`` when ``max_epochs`` is -1 (unbounded, training stopped by ``max_steps``).
``comlrl-lightning fit`` uses these when a config lists no progress bar of its own.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar


class _WithoutVersion:
    def get_metrics(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
        items = super().get_metrics(trainer, pl_module)  # type: ignore[misc]
        items.pop("v_num", None)
        return items


class RichProgress(_WithoutVersion, RichProgressBar):
    """Lightning's rich bar without ``v_num``; ``Epoch e`` alone when ``max_epochs`` is unbounded (< 1)."""

    def _get_train_description(self, current_epoch: int) -> str:
        max_epochs = self.trainer.max_epochs
        if max_epochs is not None and max_epochs >= 1:
            return super()._get_train_description(current_epoch)
        description = f"Epoch {current_epoch}"
        return f"{description:{len(self.validation_description)}}"


class TQDMProgress(_WithoutVersion, TQDMProgressBar):
    """Lightning's tqdm bar without ``v_num`` (used when ``rich`` is not installed)."""


def default_progress_bar() -> pl.Callback:
    """:class:`RichProgress` when ``rich`` is installed (Lightning's own choice then), else :class:`TQDMProgress`."""
    try:
        import rich  # noqa: F401
    except ImportError:
        return TQDMProgress()
    return RichProgress()
