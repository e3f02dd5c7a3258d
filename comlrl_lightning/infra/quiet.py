"""Start-up noise a run's user did nothing to cause, silenced precisely (each filter says why).

Called when ``comlrl_lightning`` is imported, so the Python API and ``comlrl-lightning`` start
the same way. Each filter matches one message; nothing else is hidden.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any


def _drop_litlogger_tips(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("💡 Tip: For seamless cloud")  # litlogger and litmodels


def _drop_padding_false_alarm(record: logging.LogRecord) -> bool:
    return "We strongly recommend passing in an `attention_mask`" not in str(record.msg)


def silence_start_up_noise() -> None:
    """Silence, precisely, what every run printed at start that its user did nothing to cause.

    - Lightning's ``_pytree`` helper calls ``isinstance(treespec, LeafSpec)``, deprecated by
      torch 2.13: a warning about Lightning's code at every fit, nothing a user can change.
    - Lightning advertises its cloud logger and checkpoint store (litlogger, litmodels) whenever a
      run logs or checkpoints elsewhere (INFO lines on its ``rank_zero`` logger): not a diagnosis
      of the run.
    - transformers' "We strongly recommend passing in an `attention_mask`": ``generate`` is always
      given the mask (core/generation.py); transformers drops a mask of all ones (a batch without
      padding) and then takes a finished row's pad token (= end-of-text for most tokenizers) in a
      decoding step for padding without a mask: a false alarm.
    """
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(_drop_litlogger_tips)
    logging.getLogger("transformers.modeling_utils").addFilter(_drop_padding_false_alarm)


NOT_RESUMABLE = r"You're resuming from a checkpoint that ended before the epoch ended and your dataloader is not resumable"
"""Lightning's warning on a mid-epoch resume whose ``DataLoader`` has no ``state_dict``."""


def quiet_exact_resume(datamodule: Any, checkpoint: dict[str, Any]) -> tuple | None:
    """Silence :data:`NOT_RESUMABLE` when ``checkpoint`` holds ``datamodule``'s own data position.

    Lightning asks the ``DataLoader`` for its position; ours keep theirs in the datamodule instead
    (``DecPOMDPDataModule.state_dict``: ``batches_in_epoch``, the trained batches its sampler skips on
    resume), so the resume is exact (tests/test_resume.py) and Lightning's "unreliable results"
    contradicts it. Any other datamodule (or none) keeps the warning.

    Returns:
        The filter installed (give it to :func:`unquiet`), or None when none was.
    """
    saved = checkpoint.get(type(datamodule).__qualname__) if datamodule is not None else None
    if not isinstance(saved, dict) or "batches_in_epoch" not in saved:
        return None
    warnings.filterwarnings("ignore", message=NOT_RESUMABLE)
    return warnings.filters[0]


POST_STEP_CHECKPOINT = (
    r"Using ModelCheckpoint with manual optimization and every_n_train_steps, but no pre-optimization state"
)
"""Lightning's warning (with a 12-line code sample) when ``ModelCheckpoint(every_n_train_steps=...)``
saves a module that optimizes manually."""


def quiet_post_step_checkpoints() -> tuple:
    """Silence :data:`POST_STEP_CHECKPOINT` (for one fit of a CoMLRLModule: give the result to :func:`unquiet`).

    Every CoMLRLModule optimizes manually (an optimizer per agent) and is saved at a batch end, after
    every agent stepped: the state after the last whole batch, which is what an exact resume needs
    (tests/test_resume.py). Lightning's warning that the checkpoint holds the state "AFTER optimization",
    with a code sample saving ``self.layer`` before the step, describes the intended state as a fault.
    """
    warnings.filterwarnings("ignore", message=POST_STEP_CHECKPOINT)
    return warnings.filters[0]


def unquiet(installed: tuple | None) -> None:
    """Remove a filter :func:`quiet_exact_resume` or :func:`quiet_post_step_checkpoints` installed (no-op
    for None or one already gone)."""
    if installed is not None and installed in warnings.filters:
        warnings.filters.remove(installed)
        warnings._filters_mutated()  # type: ignore[attr-defined]  # drops the cached filter decisions
