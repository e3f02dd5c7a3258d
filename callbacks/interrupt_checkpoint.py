"""`InterruptCheckpoint`: SIGTERM or Ctrl+C ends fit at a batch boundary with a resumable checkpoint and a non-zero exit."""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException

from comlrl_lightning.infra.checkpoint_io import prepare_checkpoint_dir

EXIT_SIGTERM = 128 + signal.SIGTERM
"""Exit status after SIGTERM (the shell's convention: 128 + signal number)."""
EXIT_SIGINT = 128 + signal.SIGINT
"""Exit status after Ctrl+C (SIGINT)."""


class InterruptCheckpoint(pl.Callback):
    """Turns SIGTERM and the first Ctrl+C into "finish this batch, save, exit non-zero".

    Lightning alone notes a SIGTERM, stops at the end of the batch with ``SIGTERMException`` (a
    ``SystemExit`` whose status is 0) and saves nothing. With this callback:

    - SIGTERM: at the end of the current training batch a full checkpoint (agents, optimizers,
      schedulers, RNG, loop and data position) is written to ``<dirpath>/<filename>.ckpt`` and the
      process exits with status 143 (128 + 15). ``fit --ckpt_path <that file>`` resumes exactly.
    - The first Ctrl+C (SIGINT) does the same, with status 130; a second Ctrl+C interrupts at once
      (no checkpoint: the step may be half done, some agents stepped and others not).
    - Other exceptions save nothing: a step that failed part-way is not a state to resume from.
    - At setup, rank zero checks that this folder and every ``ModelCheckpoint`` folder can be
      written (naming the path) and removes ``*.ckpt.tmp`` files left there by a killed atomic write
      (:func:`~comlrl_lightning.infra.checkpoint_io.prepare_checkpoint_dir`).

    A checkpoint left by an earlier interruption is overwritten by the next one and removed when a
    fit finishes normally. It is a plain ``Callback``, not a Lightning ``Checkpoint``, so it also
    works with ``trainer.enable_checkpointing: false`` (the main job's setting).

    Args:
        dirpath: folder of the checkpoint; default ``<trainer.log_dir>/checkpoints`` (where a
            ``ModelCheckpoint`` without ``dirpath`` writes; ``default_root_dir`` without a logger).
        filename: file name without ``.ckpt``.

    Raises:
        ValueError: an empty ``filename``.
    """

    def __init__(self, dirpath: str | None = None, filename: str = "interrupted") -> None:
        super().__init__()
        if not filename:
            raise ValueError("InterruptCheckpoint.filename: must not be empty")
        self.dirpath, self.filename = dirpath, filename
        self._exit_code = EXIT_SIGTERM
        self._previous_sigint: Any = None

    @property
    def ckpt_path(self) -> str:
        """``<dirpath>/<filename>.ckpt`` (``dirpath`` is known from ``setup`` on)."""
        return os.path.join(str(self.dirpath), self.filename + ".ckpt")

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.dirpath is None:
            log_dir = trainer.log_dir  # a broadcast: every rank must ask
            self.dirpath = os.path.join(
                log_dir if log_dir is not None else trainer.default_root_dir, "checkpoints"
            )
        if trainer.is_global_zero and stage == "fit":
            folders = {str(self.dirpath)} | {str(cb.dirpath) for cb in trainer.checkpoint_callbacks
                                             if isinstance(cb, ModelCheckpoint) and cb.dirpath}  # fmt: skip
            for folder in sorted(folders):
                prepare_checkpoint_dir(folder)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # here, not in setup: Lightning snapshots the signal handlers after setup and puts that
        # snapshot back at its teardown, which would re-install this handler after fit
        self._exit_code = EXIT_SIGTERM
        if threading.current_thread() is threading.main_thread():
            self._previous_sigint = signal.signal(signal.SIGINT, self._make_sigint_handler(trainer))

    def _make_sigint_handler(self, trainer: pl.Trainer) -> Any:
        def handler(signum: int, frame: Any) -> None:
            signal.signal(signal.SIGINT, signal.default_int_handler)  # a second Ctrl+C interrupts at once
            rank_zero_info(
                "\nCtrl+C: finishing the current batch, then saving a checkpoint (Ctrl+C again: stop now)"
            )
            self._exit_code = EXIT_SIGINT
            trainer._signal_connector.received_sigterm = True  # Lightning's own stop-at-batch-end flag

        return handler

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self._restore_sigint()
        if not isinstance(exception, SIGTERMException):
            return
        trainer.save_checkpoint(self.ckpt_path)
        rank_zero_info(
            f"Interrupted: saved {self.ckpt_path}; resume with: fit ... --ckpt_path {self.ckpt_path}"
        )
        exception.code = (
            self._exit_code
        )  # SIGTERMException is a SystemExit with status 0: make it say "stopped"

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._restore_sigint()
        # Lightning calls callbacks' teardown only when fit ends normally (not after an exception)
        if stage == "fit" and self.dirpath is not None and os.path.exists(self.ckpt_path):
            trainer.strategy.remove_checkpoint(self.ckpt_path)

    def _restore_sigint(self) -> None:
        if self._previous_sigint is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, self._previous_sigint)
            self._previous_sigint = None
