"""Exact resume from checkpoints written at an epoch end or after ``fit`` (Lightning #19617).

Lightning resumes exactly from a checkpoint written at the end of a training batch (``ModelCheckpoint
(every_n_train_steps=...)``, ``save_last``, ``InterruptCheckpoint``). Two other moments leave the
fit loop's counters in a state its restart logic misreads when ``max_steps`` is set (which forces
"restarting" whatever the epoch counters say):

- **epoch end** (``ModelCheckpoint(every_n_epochs=1)`` without validation, which saves in
  ``on_train_epoch_end``): the epoch is counted as processed but not completed, so the resumed
  run trains one extra batch "in" the finished epoch (on the next epoch's data) before moving on;
- **after fit** (``trainer.save_checkpoint`` once ``fit`` returned, or a checkpoint saved in
  ``on_train_end``): the epoch counter already moved on, even when ``max_steps`` stopped the run
  mid-epoch, so the resumed run starts the *next* epoch's shuffle at the old batch index.

:func:`canonical_loop_state` rewrites those two forms into the batch-end form of the same position
(epoch ``e`` in progress, its ``b``-th batch just trained), from which Lightning (and the
datamodule's own data position, ``batches_in_epoch``) resumes exactly: a resumed run trains the same
batches, in the same order, to bit-equal weights as one that never stopped (tests/test_resume.py).
Positions inside an epoch (batch end, validation end) are left as Lightning wrote them.
"""

from __future__ import annotations

from typing import Any

EPOCH_END = "epoch_end"
AFTER_FIT = "after_fit"
IN_EPOCH = "in_epoch"


def _progress(fit_loop: dict[str, Any], *path: str) -> dict[str, Any]:
    node = fit_loop
    for key in path:
        node = node[key]
    return node


def loop_position(checkpoint: dict[str, Any]) -> str | None:
    """Where in the fit loop ``checkpoint`` was written: :data:`IN_EPOCH`, :data:`EPOCH_END`,
    :data:`AFTER_FIT`, or None (no fit-loop state, or no batch trained in the epoch it names)."""
    fit_loop = checkpoint.get("loops", {}).get("fit_loop")
    if not fit_loop:
        return None
    epoch = _progress(fit_loop, "epoch_progress", "current")
    batches = _progress(fit_loop, "epoch_loop.batch_progress", "current")
    if epoch["started"] == epoch["processed"] + 1:
        return IN_EPOCH
    if batches["processed"] == 0 or batches["completed"] != batches["processed"]:
        return None
    if epoch["started"] == epoch["processed"] == epoch["completed"] + 1:
        return EPOCH_END
    if epoch["started"] == epoch["processed"] == epoch["completed"]:
        return AFTER_FIT
    return None


def canonical_loop_state(checkpoint: dict[str, Any]) -> str | None:
    """Rewrite an epoch-end or after-fit ``checkpoint["loops"]`` in place into the batch-end form of
    the same position (see the module docstring); call it before Lightning restores the loops
    (``LightningModule.on_load_checkpoint`` runs before that).

    The position is epoch ``e = started − 1`` with ``b = batch_progress.current.processed`` batches
    trained. When ``b`` is not the epoch's last batch (``fit`` stopped on ``max_steps`` mid-epoch),
    the batch-end form has the epoch started but not processed and the last batch processed but not
    completed (Lightning completes it on restart and trains batch ``b`` next). When it is the last
    batch, the state becomes a clean boundary: epoch ``e`` counted as done and no batch of epoch
    ``e + 1`` begun, so the resumed run starts epoch ``e + 1`` as a fresh one (its
    ``on_train_epoch_start`` runs, and the epoch counters stay in step for a later checkpoint; a
    batch-end checkpoint at an epoch's last batch would skip both).

    Returns:
        The position found (:func:`loop_position`): only :data:`EPOCH_END` and :data:`AFTER_FIT`
        are rewritten.
    """
    position = loop_position(checkpoint)
    if position not in (EPOCH_END, AFTER_FIT):
        return position
    fit_loop = checkpoint["loops"]["fit_loop"]
    batch_progress = fit_loop["epoch_loop.batch_progress"]
    if batch_progress["is_last_batch"]:  # a whole epoch: a clean boundary before epoch e + 1
        for part in ("current", "total"):
            epoch = _progress(fit_loop, "epoch_progress", part)
            epoch["ready"] = epoch["processed"] = epoch["completed"] = epoch["started"]
        batch_progress_part = batch_progress["current"]
        for key in ("ready", "started", "processed", "completed"):
            batch_progress_part[key] = 0
        batch_progress["is_last_batch"] = False
        return position
    for part in ("current", "total"):  # mid-epoch: the batch-end form of batch b
        epoch = _progress(fit_loop, "epoch_progress", part)
        epoch["processed"] = epoch["completed"] = epoch["started"] - 1
        batches = batch_progress[part]
        batches["completed"] = batches["processed"] - 1
    fit_loop["epoch_loop.state_dict"]["_batches_that_stepped"] -= 1
    return position
