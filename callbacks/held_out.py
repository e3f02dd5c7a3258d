"""`HeldOutOutcomes`: each validation problem's outcome at every validation, and the paired gain."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl

from comlrl_lightning.core.evaluation import paired_gain_interval, path_solved


class HeldOutOutcomes(pl.Callback):
    """Records, at every validation run, each validation problem's outcome: the team's last joint
    action solved it (the reward's ``PASS_AT_1``; the mean over paths with ``num_generations_eval`` > 1),
    keyed by the episode's index. :class:`~comlrl_lightning.callbacks.FitSummary` prints
    :meth:`summary` after ``fit``: the first validation (before training, with ``validate_before_fit``)
    against the last, with a 95% interval on the gain
    paired over the problems (:func:`~comlrl_lightning.core.evaluation.paired_gain_interval`).

    Attributes:
        history: one ``{episode index: outcome in [0, 1]}`` per finished validation run, in order.
    """

    def __init__(self) -> None:
        self.history: list[dict[int, float]] = []
        self._current: dict[int, float] = {}

    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._current = {}

    def on_validation_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: Any,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        solved = path_solved(outputs["turns"], final=True) if isinstance(outputs, dict) else None
        if solved is None:  # the reward reports no PASS_AT_1: nothing to record
            return
        per_episode = solved.nan_to_num(0.0).view(len(batch), -1).mean(dim=1)
        self._current.update((ep.index, float(v)) for ep, v in zip(batch, per_episode))

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._current and not trainer.sanity_checking:
            self.history.append(dict(self._current))

    def summary(self) -> str | None:
        """``held-out team success: a -> b (gain, its 95% paired interval, problems)``, or None with fewer
        than two validation runs over the same problems."""
        if len(self.history) < 2 or set(self.history[0]) != set(self.history[-1]):
            return None
        keys = sorted(self.history[0])
        before, after = [self.history[0][k] for k in keys], [self.history[-1][k] for k in keys]
        gain, lo, hi = paired_gain_interval(before, after)
        verdict = "excludes 0" if lo > 0 or hi < 0 else "includes 0: not beyond noise"
        return (
            f"held-out team success: {sum(before) / len(keys):.3f} -> {sum(after) / len(keys):.3f}; gain {gain:+.3f}, "
            f"95% interval [{lo:+.3f}, {hi:+.3f}] paired over {len(keys)} problems ({verdict})"
        )

    def state_dict(self) -> dict[str, Any]:
        """The history, saved in checkpoints: a resumed run's gain starts at the first validation ever
        recorded (a resume skips the step-0 validation), not at the resume."""
        return {"history": [{int(k): float(v) for k, v in run.items()} for run in self.history]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.history = [{int(k): float(v) for k, v in run.items()} for run in state_dict.get("history", [])]
