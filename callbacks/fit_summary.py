"""The end-of-fit summary: where the logs are, and the start -> end of the scalars that say whether
the run learned.

:class:`FitSummary` records the scalars it is given (``val/pass@k``, ``val/reward``, every reward
term, the training ``reward``) as the fit logs them, keeps them in the checkpoint (so a resumed run's
summary starts at the first value ever recorded, not at the resume), and prints one line per scalar
when ``fit`` ends: ``key: start -> end (change, points)``, a 95% Wilson interval for a ``pass@k``,
and ``FELL`` on a held-out (``val/``) scalar that ended below its start. Every
:class:`~comlrl_lightning.algorithms.base.CoMLRLModule` adds one to a fit that lists none
(``configure_callbacks``), so a Python ``trainer.fit`` prints it as ``comlrl-lightning fit`` does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.loggers import TensorBoardLogger

from comlrl_lightning.callbacks.held_out import HeldOutOutcomes
from comlrl_lightning.core import metrics as M
from comlrl_lightning.core.evaluation import wilson_interval
from comlrl_lightning.infra.quiet import quiet_exact_resume, quiet_post_step_checkpoints, unquiet

SUMMARY_KEYS = ("val/pass@*", "val/final/pass@*", M.VAL_REWARD, "val/rewards/*", M.REWARD)
"""The scalars summarised; a trailing ``*`` matches any ending (``val/rewards/*``: each reward term,
e.g. ``val/rewards/coop_code/<term>/mean``)."""


def summary_line(key: str, values: Sequence[float], num_problems: int | None) -> str:
    """``key: start -> end (change, points)``; a ``pass@k`` adds each end's 95% Wilson interval over
    ``num_problems`` validation problems (:func:`~comlrl_lightning.core.evaluation.wilson_interval`);
    a held-out (``val/``) scalar whose end is below its start ends in ``FELL``."""
    first, last = values[0], values[-1]
    text = f"{key}: {first:.3f} -> {last:.3f} ({last - first:+.3f}, {len(values)} points)"
    if "pass@" in key and num_problems and all(0.0 <= v <= 1.0 for v in (first, last)):
        ci = [f"[{lo:.3f}, {hi:.3f}]" for lo, hi in (wilson_interval(v, num_problems) for v in (first, last))]
        text += f"; 95% interval over {num_problems} problems: {ci[0]} -> {ci[1]}"
    if key.startswith("val/") and last < first:
        text += "  FELL: the held-out value ended below its start"
    return text


def num_val_problems(trainer: Any, datamodule: Any) -> int | None:
    """Problems one validation pass scores: the validation rows, capped by ``limit_val_batches``."""
    rows = getattr(datamodule, "val_rows", None)
    if rows is None:
        return None
    n, batches = len(rows), sum(getattr(trainer, "num_val_batches", None) or [0])
    size = getattr(datamodule, "val_batch_size", None)
    return min(n, batches * size) if batches and size else n


class FitSummary(pl.Callback):
    """Print the start -> end of the run's key scalars when ``fit`` ends (rank 0, stdout).

    Values are read from ``trainer.callback_metrics``: a held-out scalar after every validation run
    (the one before fit too, e.g. ``fit --validate_before_fit``; not the sanity check), a training
    scalar whenever the module logs a new value of it. NaN and inf are left out.

    Args:
        keys: the scalars to summarise (default :data:`SUMMARY_KEYS`); a trailing ``*`` matches any ending.
    """

    def __init__(self, keys: Sequence[str] = SUMMARY_KEYS) -> None:
        self.keys = tuple(keys)
        self.history: dict[str, list[float]] = {}
        """Scalar -> its recorded values, oldest first (saved in checkpoints)."""
        # the last value object recorded per training scalar (kept alive, so its id is not reused)
        self._seen: dict[str, Any] = {}
        self._quiet: tuple | None = None  # the warning filter of an exact resume, until training starts
        self._quiet_saves: tuple | None = None  # the post-step checkpoint warning's filter, for the fit

    def _matches(self, key: str) -> bool:
        return any(key.startswith(p[:-1]) if p.endswith("*") else key == p for p in self.keys)

    def _record(self, trainer: pl.Trainer, held_out: bool) -> None:
        for key, value in trainer.callback_metrics.items():
            if key.startswith("val/") != held_out or not self._matches(key):
                continue
            if not held_out:  # callback_metrics keeps the last value: record a newly logged one only
                if self._seen.get(key) is value:
                    continue
                self._seen[key] = value
            v = float(value)
            if math.isfinite(v):
                self.history.setdefault(key, []).append(v)

    # In every fit of a CoMLRLModule (configure_callbacks), so this is where the fit silences the Lightning
    # warnings that contradict what it does (infra/quiet.py): a resume that restores the data position
    # exactly, from the checkpoint's load until the first batch (the warning comes from the epoch loop's
    # reset in between); batch-end checkpoints of the post-step state, for the whole fit.
    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: Any) -> None:
        unquiet(self._quiet)
        self._quiet = quiet_exact_resume(getattr(trainer, "datamodule", None), checkpoint)

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        unquiet(self._quiet)
        self._quiet = None

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":  # the fit's batch-end checkpoints are the post-step state on purpose
            unquiet(self._quiet_saves)
            self._quiet_saves = quiet_post_step_checkpoints()

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        unquiet(self._quiet)  # a fit that ended before its first batch
        unquiet(self._quiet_saves)
        self._quiet = self._quiet_saves = None

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._record(trainer, held_out=True)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        self._record(trainer, held_out=False)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.is_global_zero:
            print("\n".join(self.lines(trainer)), flush=True)

    def lines(self, trainer: pl.Trainer) -> list[str]:
        """The summary: the log folder (when there is a logger), then one :func:`summary_line` per scalar
        (held-out pass@k first, then held-out rewards, then training scalars; shorter keys first), then
        each :class:`~comlrl_lightning.callbacks.HeldOutOutcomes`' paired gain."""
        out = ["\nFit summary (start -> end):"]
        if isinstance(trainer.logger, TensorBoardLogger) and trainer.log_dir:
            out[0] = (
                f"\nTensorBoard logs: {trainer.log_dir}\n  view them with: tensorboard --logdir {trainer.logger.root_dir}"
            )
        n = num_val_problems(trainer, getattr(trainer, "datamodule", None))
        order = {p: i for i, p in enumerate(self.keys)}

        def rank(key: str) -> tuple[int, int, str]:
            first = min(
                i for p, i in order.items() if (key.startswith(p[:-1]) if p.endswith("*") else key == p)
            )
            return first, len(key), key

        for key in sorted(self.history, key=rank):
            out.append(f"  {summary_line(key, self.history[key], n)}")
        for cb in trainer.callbacks:  # the held-out gain paired over the problems, when recorded
            line = cb.summary() if isinstance(cb, HeldOutOutcomes) else None
            if line:
                out.append(f"  {line}")
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"history": {k: list(v) for k, v in self.history.items()}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.history = {k: list(v) for k, v in state_dict.get("history", {}).items()}
