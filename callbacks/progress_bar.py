"""Progress bars without the run-version column, with true totals and a sane epoch count.

Lightning's bars show ``v_num`` (the logger's version, already in the log folder's name; the rich
bar prints it as ``v_num: 0.000``); their batch total is the epoch's batches even when
``trainer.max_steps`` ends the fit sooner (Lightning caps it only when ``max_epochs`` is -1, and then
by optimizer steps, which a multi-agent batch takes one per agent: ``150/256`` for a fit that stops
at batch 150); and the rich bar's description is ``Epoch e/<max_epochs - 1>``, which reads
``Epoch 1/-2`` when ``max_epochs`` is -1 and ``Epoch 1/999`` for a round loop that stops itself.
When stdout is not a terminal (``nohup``, Slurm, ``| tee``), a bar is no use: rich draws nothing until
the fit ends and tqdm writes carriage returns; :class:`ProgressLines` prints one plain line of the
key metrics every ``trainer.log_every_n_steps`` batches instead. ``comlrl-lightning fit`` uses
:func:`default_progress_bar` (one of these three) when a config lists no progress bar of its own.
"""

from __future__ import annotations

import math
import re
import sys
import time
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ProgressBar, RichProgressBar, TQDMProgressBar

from comlrl_lightning.core import metrics as M


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


class ProgressLines(ProgressBar):
    """The progress "bar" of a run whose output goes to a file: plain lines, flushed as printed.

    Every ``trainer.log_every_n_steps`` batches (when Lightning logs the step's scalars; and at the
    last batch) one line on stdout::

        epoch 0 batch 5/40 | reward 0.3125 | loss -0.0123 0.0456 | val/pass@1 0.25 | 0:01:23, 16.6 s/batch

    ``batch`` counts the batches trained so far (the x-axis of the logged curves; on a resume, from
    the start of the run), ``/40`` the batches the epoch will run (capped by ``max_steps``);
    ``reward`` is the step's shared reward, ``loss`` each agent's loss in agent order, then the
    last validation's held-out values (``val/pass@k``, ``val/final/pass@k``, ``val/reward``; the one
    before fit too) once one has run; the wall time since the fit started and the mean seconds per batch since then. After each
    validation (not the sanity check) one ``validation after batch N | ...`` line with the held-out
    values. Metrics a module does not log are left out. Rank zero only.
    """

    def __init__(self) -> None:
        super().__init__()
        self._enabled = True
        self._t0: float | None = None
        self._batches_at_start = 0
        self._batches = 0  # trained so far, as the last line said (a validation names it)
        self._held_out: list[
            str
        ] = []  # the last validation's values (one before fit is not in the fit's metrics)

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    def print(self, *args: Any, **kwargs: Any) -> None:
        if self._enabled:
            print(*args, **{"flush": True, **kwargs})

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._t0 = time.monotonic()
        self._batches_at_start = self._batches = trainer.fit_loop.epoch_loop._batches_that_stepped

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        every = trainer.log_every_n_steps
        batches = self._batches = trainer.fit_loop.epoch_loop._batches_that_stepped + 1  # not counted yet
        last = trainer.fit_loop.epoch_loop.batch_progress.is_last_batch or trainer.should_stop
        if not every or not (batches % every == 0 or last or _at_max_steps(trainer)):
            return
        done = trainer.fit_loop.epoch_loop.batch_progress.current.completed + 1
        # batches_left counts this batch in global_step, not yet in the epoch's completed batches
        total = min(trainer.num_training_batches, batches_left(trainer, fresh_epoch=False) + 1)
        parts = [f"epoch {trainer.current_epoch} batch {batches}" + (f"/{total}" if done == batches else "")]
        if done != batches:  # a resumed run or a later epoch: the position in this epoch too
            parts[0] += f" ({done}/{total} of the epoch)"
        parts += metric_parts(trainer.callback_metrics, train_only=True) + self._held_out
        if self._t0 is not None:
            wall = time.monotonic() - self._t0
            per = wall / max(batches - self._batches_at_start, 1)
            parts.append(f"{_clock(wall)}, {per:.1f} s/batch")
        self.print(" | ".join(parts))

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        held_out = metric_parts(trainer.callback_metrics, held_out_only=True)
        if held_out:
            self._held_out = held_out
            self.print(" | ".join([f"validation after batch {self._batches}", *held_out]))


HELD_OUT = re.compile(r"^val/(final/)?pass@\d+$")
"""The held-out scalars :class:`ProgressLines` prints (with ``val/reward``)."""


def metric_parts(metrics: dict[str, Any], held_out_only: bool = False, train_only: bool = False) -> list[str]:
    """``["reward 0.3125", "loss -0.0123 0.0456", "val/pass@1 0.25", ...]`` (4 significant digits) from ``metrics``
    (``trainer.callback_metrics``): the team's ``reward``, each agent's ``loss`` (``z_agent_<i>/loss``,
    in agent order), then the held-out ``val/pass@k``, ``val/final/pass@k`` and ``val/reward``, each
    one present; ``held_out_only`` / ``train_only``: the held-out ones / the others alone."""
    values = {key: float(value) for key, value in metrics.items() if _is_number(value)}
    parts = []
    if not held_out_only and M.REWARD in values:
        parts.append(f"{M.REWARD} {values[M.REWARD]:.4g}")
    losses = sorted(
        (int(m.group(1)), v)
        for k, v in values.items()
        if (m := re.fullmatch(re.escape(M.AGENT_PREFIX) + r"(\d+)/" + M.LOSS, k))
    )
    if not held_out_only and losses:
        parts.append("loss " + " ".join(f"{v:.4g}" for _, v in losses))
    if train_only:
        return parts
    parts += [f"{k} {values[k]:.4g}" for k in sorted(values) if HELD_OUT.match(k)]
    if M.VAL_REWARD in values:
        parts.append(f"{M.VAL_REWARD} {values[M.VAL_REWARD]:.4g}")
    return parts


def _is_number(value: Any) -> bool:
    try:
        return getattr(value, "numel", lambda: 1)() == 1 and math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def _at_max_steps(trainer: pl.Trainer) -> bool:
    """This batch is the one ``max_steps`` ends the fit at (``global_step`` grows by the module's
    ``steps_per_batch`` a batch; already counted for this one)."""
    return trainer.max_steps is not None and 0 <= trainer.max_steps <= trainer.global_step


def _clock(seconds: float) -> str:
    minutes, s = divmod(int(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{s:02d}"


def default_progress_bar() -> pl.Callback:
    """:class:`ProgressLines` when stdout is not a terminal (a log file, a pipe); else :class:`RichProgress`
    when ``rich`` is installed (Lightning's own choice then), else :class:`TQDMProgress`."""
    if not _is_terminal(sys.stdout):
        return ProgressLines()
    try:
        import rich  # noqa: F401
    except ImportError:
        return TQDMProgress()
    return RichProgress()


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False
