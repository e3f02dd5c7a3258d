"""Start-up noise a run's user did nothing to cause, silenced precisely (each filter says why).

Called when ``comlrl_lightning`` is imported, so the Python API and ``comlrl-lightning`` start
the same way. Each filter matches one message; nothing else is hidden.
"""

from __future__ import annotations

import logging
import warnings


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
