"""Progress bars without the run-version column, with true totals and a sane epoch count.

Lightning's bars show ``v_num`` (the logger's version, already in the log folder's name; the rich
bar prints it as ``v_num: 0.000``); their batch total is the epoch's batches even when
``trainer.max_steps`` ends the fit sooner (Lightning caps it only when ``max_epochs`` is -1, and then
by optimizer steps, which a multi-agent batch takes one per agent: ``150/256`` for a fit that stops
at batch 150); and the rich bar's description is ``Epoch e/<max_epochs - 1>``, which reads
``Epoch 1/-2`` when ``max_epochs`` is -1 and ``Epoch 1/999`` for a round loop that stops itself.
``comlrl-lightning fit`` uses these when a config lists no progress bar of its own.
"""

from __future__ import annotations

import math
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar


def batches_left(trainer: pl.Trainer, fresh_epoch: bool) -> int | float:
    """Training batches the current epoch will run: its batches, capped by what ``trainer.max_steps``
    leaves (``global_step`` grows by the module's ``steps_per_batch`` a batch: one per agent for the
    MAGRPO family), plus the batches of this epoch already run (0 for a ``fresh_epoch``; on a resume
    inside an epoch, those before it)."""
    total = trainer.num_training_batches
    if trainer.max_steps is None or trainer.max_steps < 0:
        return total
    per = max(int(getattr(trainer.lightning_module, "steps_per_batch", 1) or 1), 1)
    done = 0 if fresh_epoch else trainer.fit_loop.epoch_loop.batch_progress.current.completed
    left = math.ceil(max(trainer.max_steps - trainer.global_step, 0) / per)
    return min(total, done + left)


class _TrueTotals:
    _fresh_epoch = False  # inside on_train_epoch_start: the loop's batch counts are the last epoch's still

    def get_metrics(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
        items = super().get_metrics(trainer, pl_module)  # type: ignore[misc]
        items.pop("v_num", None)
        return items

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._fresh_epoch = True
        try:
            super().on_train_epoch_start(trainer, pl_module)  # type: ignore[misc]
        finally:
            self._fresh_epoch = False

    @property
    def total_train_batches(self) -> int | float:
        return batches_left(self.trainer, self._fresh_epoch)  # type: ignore[attr-defined]


class RichProgress(_TrueTotals, RichProgressBar):
    """Lightning's rich bar without ``v_num``, its total the batches the epoch will really run
    (:func:`batches_left`); ``Round r/R`` for a module with rounds (MADPOIter, MARLHFIter: they stop
    after their last round, whatever ``max_epochs``), ``Epoch e`` alone when ``max_epochs`` is unbounded."""

    def _get_train_description(self, current_epoch: int) -> str:
        module = self.trainer.lightning_module
        rounds = getattr(getattr(module, "rounds", None), "num_rounds", None)
        if isinstance(rounds, int) and isinstance(getattr(module, "round", None), int):
            description = f"Round {min(module.round + 1, rounds)}/{rounds}"
        elif self.trainer.max_epochs is not None and self.trainer.max_epochs >= 1:
            return super()._get_train_description(current_epoch)
        else:
            description = f"Epoch {current_epoch}"
        return f"{description:{len(self.validation_description)}}"


class TQDMProgress(_TrueTotals, TQDMProgressBar):
    """Lightning's tqdm bar without ``v_num``, its total as :class:`RichProgress`'s (used when ``rich``
    is not installed)."""


def default_progress_bar() -> pl.Callback:
    """:class:`RichProgress` when ``rich`` is installed (Lightning's own choice then), else :class:`TQDMProgress`."""
    try:
        import rich  # noqa: F401
    except ImportError:
        return TQDMProgress()
    return RichProgress()
