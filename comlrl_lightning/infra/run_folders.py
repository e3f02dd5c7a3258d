"""The folders a fit writes, locked before anything is written there; an earlier run's ``config.yaml`` kept.

Why before: Lightning's ``fit`` writes into the run's folders before the module's ``setup`` (where
:func:`~comlrl_lightning.infra.run_lock.hold_checkpoint_folders` locks the checkpoint folders): the
loggers create their folder and an event file, LightningCLI's ``SaveConfigCallback`` writes
``config.yaml`` into the log folder, and ``InterruptCheckpoint`` removes the ``*.ckpt.tmp`` files of
every checkpoint folder (:func:`~comlrl_lightning.infra.checkpoint_io.prepare_checkpoint_dir`). A run
refused there had already deleted the running run's ``last.ckpt.tmp`` mid-write: that run's rename
then failed, its lock was freed, and a third run wrote ``last-v1.ckpt`` beside its ``last.ckpt``.
``comlrl-lightning fit`` therefore calls :func:`hold_fit_folders` before ``trainer.fit``, so a second
run is refused before it writes or removes anything in the first one's folders.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

from comlrl_lightning.callbacks.agent_checkpoint import AgentCheckpoint
from comlrl_lightning.callbacks.interrupt_checkpoint import InterruptCheckpoint
from comlrl_lightning.infra.run_lock import RunFolderBusy, hold_run_folder

_log = logging.getLogger("lightning.pytorch.run_folders")
"""Printed as Lightning's own lines are (its ``lightning.pytorch`` handler)."""

_NEXT_VERSIONS = 100
"""How many later ``version_<n>`` folders an automatically numbered logger tries when the one it picked is
held by a run started at the same moment (both listed the folder before either created it)."""


def _local(path: Any) -> bool:
    return isinstance(path, (str, os.PathLike)) and bool(str(path)) and "://" not in str(path)


def _log_dir(trainer: Any) -> str | None:
    """``trainer.log_dir`` without its broadcast (callable before the processes connect): the first
    logger's folder, ``default_root_dir`` without a logger."""
    if not trainer.loggers:
        return trainer.default_root_dir
    first = trainer.loggers[0]
    return first.log_dir if isinstance(first, (TensorBoardLogger, CSVLogger)) else first.save_dir


def fit_folders(trainer: Any) -> list[tuple[str, str]]:
    """``(folder, the setting that chose it)`` for each local folder a fit of ``trainer`` writes, resolved
    as Lightning resolves them at setup: a TensorBoard or CSV logger's version folder (``config.yaml``,
    event files, ``hparams.yaml``), each ``ModelCheckpoint`` / ``InterruptCheckpoint`` folder (its
    ``dirpath``, else ``<log dir>/checkpoints``) and each ``AgentCheckpoint`` folder (else
    ``<log dir>/agents``)."""
    log_dir = _log_dir(trainer)
    out = []
    if trainer.loggers and isinstance(trainer.loggers[0], (TensorBoardLogger, CSVLogger)) and _local(log_dir):
        out.append((str(log_dir), "trainer.logger"))
    for callback in trainer.callbacks:
        if not isinstance(callback, (ModelCheckpoint, InterruptCheckpoint, AgentCheckpoint)):
            continue
        default = "agents" if isinstance(callback, AgentCheckpoint) else "checkpoints"
        folder = callback.dirpath or (os.path.join(str(log_dir), default) if log_dir else None)
        if _local(folder):
            out.append((str(folder), f"{type(callback).__name__}.dirpath"))
    return out


def hold_fit_folders(trainer: Any) -> None:
    """Lock (rank zero) every folder of :func:`fit_folders` before ``trainer.fit`` writes anything.

    A logger numbering its versions itself (``version`` not given) whose pick is held by a run started
    at the same moment moves to the next number instead of being refused.

    Raises:
        RunFolderBusy: another running process holds one of them (naming it, the process and the
            setting that chose the folder); nothing has been written then.
    """
    if not trainer.is_global_zero:
        return
    logger = trainer.loggers[0] if trainer.loggers else None
    numbered = isinstance(logger, (TensorBoardLogger, CSVLogger)) and logger._version is None
    for _ in range(_NEXT_VERSIONS):
        first, *rest = fit_folders(trainer) or [(None, "")]
        try:
            if first is not None:
                hold_run_folder(*first)
            break
        except RunFolderBusy:
            if not numbered:  # (then the log folder is the first one)
                raise
            logger._version = logger.version + 1  # the loggers' own attribute: their next free number
    for folder, what in rest:
        hold_run_folder(folder, what)


def keep_earlier_config(path: str, text: str) -> str | None:
    """Before ``config.yaml`` at ``path`` is overwritten with ``text``: a different earlier one (a run
    restarted or resumed in its folder) is renamed ``config-v<n>.yaml`` (the first free ``n``) and a
    line says so; returns the new name, None when there was nothing to keep."""
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        if f.read() == text:
            return None
    stem, ext = os.path.splitext(path)
    n = 1
    while os.path.exists(f"{stem}-v{n}{ext}"):
        n += 1
    kept = f"{stem}-v{n}{ext}"
    os.replace(path, kept)
    _log.info(
        f"{os.path.basename(path)}: {path} held the config of an earlier run in this folder; kept as "
        f"{os.path.basename(kept)}, this run's config is {os.path.basename(path)}"
    )
    return kept


class KeepingSaveConfigCallback(SaveConfigCallback):
    """LightningCLI's ``SaveConfigCallback`` (``config.yaml`` in the log folder, overwritten) that first
    keeps an earlier run's different ``config.yaml`` (:func:`keep_earlier_config`)."""

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if not self.already_saved and self.save_to_log_dir and not self.multifile:
            log_dir = trainer.log_dir  # a broadcast: every rank asks
            if trainer.is_global_zero and _local(log_dir):
                text = self.parser.dump(self.config, skip_none=False)
                keep_earlier_config(os.path.join(str(log_dir), self.config_filename), text)
        super().setup(trainer, pl_module, stage)
