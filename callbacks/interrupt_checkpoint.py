"""`InterruptCheckpoint`: SIGTERM or Ctrl+C ends fit with the last trained batch's resumable checkpoint and a non-zero exit."""

from __future__ import annotations

import copy
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException

from comlrl_lightning.infra.checkpoint_io import prepare_checkpoint_dir
from comlrl_lightning.infra.rng import collect_rng_states
from comlrl_lightning.infra.run_lock import release_run_folders

EXIT_SIGTERM = 128 + signal.SIGTERM
"""Exit status after SIGTERM (the shell's convention: 128 + signal number)."""
EXIT_SIGINT = 128 + signal.SIGINT
"""Exit status after Ctrl+C (SIGINT)."""


class InterruptCheckpoint(pl.Callback):
    """Turns SIGTERM and the first Ctrl+C into "save the last trained batch's state, exit non-zero".

    Lightning alone notes a SIGTERM, stops at the end of the batch with ``SIGTERMException`` (a
    ``SystemExit`` whose status is 0) and saves nothing; a signal that lands in a long generation, a
    hanging reward or a validation epoch waits for all of it. With this callback:

    - SIGTERM: a full checkpoint (agents, optimizers, schedulers, RNG, loop and data position) of
      the state after the last trained batch is written to ``<dirpath>/<filename>.ckpt`` and the
      process exits with status 143 (128 + 15). ``fit --ckpt_path <that file>`` resumes exactly.
    - Wherever the signal lands in a training batch (generation, reward, backward, or the updates
      after some agents already stepped) or in a validation run inside fit, that work is abandoned
      at once (the handler raises there) and the checkpoint is the batch-end checkpoint of the batch
      before, the same state a ``ModelCheckpoint(every_n_train_steps)`` writes there. To undo the
      agents that already stepped, each optimizer's parameters and state are copied (on their own
      device) just before its first step in a batch and put back on such an interruption; the
      copies are dropped at the batch end (memory: one copy of the weights and optimizer state of
      every optimizer, held from a batch's first optimizer step to its end; ``undo_updates=False``
      saves it and finishes such a batch before saving instead). Under a multi-process strategy
      every rank finishes its batch (an abandoned collective would hang the others), then saves.
    - The first Ctrl+C (SIGINT) does the same, with status 130; a second Ctrl+C interrupts at once
      (no checkpoint: the step may be half done, some agents stepped and others not).
    - A signal before the first batch of this fit ends stops at once and saves nothing (nothing was
      trained; a resumed fit's own ``ckpt_path`` is still there).
    - Long work outside any batch that a module marks with :meth:`interruptible_phase` (MARLHF's
      phase 1: building the preference pairs, the reward-model epochs) is abandoned at once too:
      once the phase's own resumable state is on disk (MARLHF: ``phase1_state.pt``) the checkpoint
      is written as above and resumes it; before that nothing is trained and nothing is saved.
    - Other exceptions save nothing: a step that failed part-way is not a state to resume from.
    - At setup, rank zero checks that this folder and every ``ModelCheckpoint`` folder can be
      written (naming the path) and removes ``*.ckpt.tmp`` files left there by a killed atomic write
      (:func:`~comlrl_lightning.infra.checkpoint_io.prepare_checkpoint_dir`).

    ``comlrl-lightning fit`` adds one to every fit whose config lists none (``--save_on_interrupt
    false`` leaves it out). A checkpoint left by an earlier interruption is overwritten by the next
    one and removed when a fit finishes normally. It is a plain ``Callback``, not a Lightning
    ``Checkpoint``, so it also works with ``trainer.enable_checkpointing: false`` (the main job's
    setting).

    Args:
        dirpath: folder of the checkpoint; default ``<trainer.log_dir>/checkpoints`` (where a
            ``ModelCheckpoint`` without ``dirpath`` writes; ``default_root_dir`` without a logger).
        filename: file name without ``.ckpt``.
        undo_updates: keep the copies above, so a signal after a batch's first optimizer step saves
            at once (default True); False: finish that batch's updates first, then save.

    Raises:
        ValueError: an empty ``filename``.
    """

    def __init__(
        self, dirpath: str | None = None, filename: str = "interrupted", undo_updates: bool = True
    ) -> None:
        super().__init__()
        if not filename:
            raise ValueError("InterruptCheckpoint.filename: must not be empty")
        self.dirpath, self.filename, self.undo_updates = dirpath, filename, undo_updates
        self._undo: list[tuple[Any, list[torch.Tensor], dict[str, Any]]] = []  # (optimizer, params, state)
        self._undo_schedulers: list[dict[str, Any]] | None = None
        self._exit_code = EXIT_SIGTERM
        self._previous: dict[int, Any] = {}
        self._abandonable = False  # in a batch's generation/reward or in validation: raise at the signal
        self._pending = False  # a signal came while the work could not be abandoned
        self._aborted = False  # the handler raised: the live loop state is not a batch end
        self._last_batch_end: dict[str, Any] | None = None
        self._phase: tuple[str, Callable[[], bool]] | None = None  # (what, whether it has saved state)

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
            folders = {str(self.dirpath)} | {
                str(cb.dirpath)
                for cb in trainer.checkpoint_callbacks
                if isinstance(cb, ModelCheckpoint) and cb.dirpath
            }
            for folder in sorted(folders):
                prepare_checkpoint_dir(folder)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # here, not in setup: Lightning snapshots the signal handlers after setup and puts that
        # snapshot back at its teardown, which would re-install these handlers after fit
        self._exit_code, self._aborted, self._phase = EXIT_SIGTERM, False, None
        self._pending = trainer.received_sigterm  # a signal in the sanity check: stop at once
        self._last_batch_end, self._undo, self._undo_schedulers = None, [], None
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                self._previous[signum] = signal.signal(signum, self._make_handler(trainer, signum))

    def _make_handler(self, trainer: pl.Trainer, signum: int) -> Any:
        previous = signal.getsignal(signum)

        def handler(num: int, frame: Any) -> None:
            if signum == signal.SIGINT:
                signal.signal(signal.SIGINT, signal.default_int_handler)  # a second Ctrl+C interrupts at once
                self._exit_code = EXIT_SIGINT
            elif callable(previous):  # Lightning's notifier (kills launched children, tells other ranks)
                previous(num, frame)
            trainer._signal_connector.received_sigterm = True  # Lightning's own stop-at-batch-end flag
            if self._abandonable and trainer.world_size == 1:
                what = (
                    self._phase[0] if self._phase else "the current batch (its updates undone) or validation"
                )
                self._stop(trainer, f"abandoning {what}")
            self._pending = True
            rank_zero_info(
                f"\n{signal.Signals(signum).name}: finishing the current batch's updates, then saving a "
                "checkpoint" + (" (Ctrl+C again: stop now)" if signum == signal.SIGINT else "")
            )

        return handler

    def _stop(self, trainer: pl.Trainer, what: str) -> None:
        self._aborted, self._abandonable = True, False
        then = (
            "saving what resumes it, if anything"
            if self._phase
            else "saving the state after the last trained batch"
        )
        rank_zero_info(f"\nInterrupted: {what}; {then}")
        raise SIGTERMException(self._exit_code)

    @contextmanager
    def interruptible_phase(
        self, trainer: pl.Trainer, what: str, saved: Callable[[], bool]
    ) -> Iterator[None]:
        """Work outside any training batch (``what``, named in messages) that an interrupt abandons at
        once; ``saved()`` says whether the work's own resumable state is on disk by then (a checkpoint
        is written only then). Single process only (ranks finish the work: see the class docstring).

        Raises:
            SIGTERMException: a signal came before or during the phase (the fit then stops).
        """
        self._phase = (what, saved)
        if self._pending and trainer.world_size == 1:
            self._stop(trainer, f"stopping before {what}")
        self._abandonable = True
        yield  # an exception leaves _phase set for on_exception
        self._abandonable, self._phase = False, None

    # the phases in which an interrupt abandons the work at once: nothing of the training state moved
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._abandonable = True
        if self._pending and trainer.world_size == 1:
            self._stop(trainer, "stopping before the next batch")

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any
    ) -> None:
        # a parameter change: copy what it changes (once per optimizer and batch) so an interrupt can
        # put the batch-start state back; without the copies, finish the batch, then save
        if not (self.undo_updates and trainer.world_size == 1 and self._abandonable):
            self._abandonable = False
            return
        if self._undo_schedulers is None:  # the batch's first step: no scheduler has stepped yet
            self._undo_schedulers = [
                copy.deepcopy(c.scheduler.state_dict()) for c in trainer.lr_scheduler_configs
            ]
        raw = getattr(optimizer, "_optimizer", optimizer)
        if all(o is not raw for o, _, _ in self._undo):
            with torch.no_grad():
                params = [p.detach().clone() for g in raw.param_groups for p in g["params"]]
            self._undo.append((raw, params, copy.deepcopy(raw.state_dict())))

    def _undo_batch_updates(self, trainer: pl.Trainer) -> None:
        """Put back every parameter, optimizer state and scheduler state the aborted batch changed."""
        with torch.no_grad():
            for raw, params, state in reversed(self._undo):  # the earliest copy last (shared parameters)
                for p, saved in zip((p for g in raw.param_groups for p in g["params"]), params):
                    p.copy_(saved)
                raw.load_state_dict(state)
        for config, state in zip(trainer.lr_scheduler_configs, self._undo_schedulers or []):
            config.scheduler.load_state_dict(state)
        self._undo, self._undo_schedulers = [], None

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._abandonable = False
        self._undo, self._undo_schedulers = [], None  # the batch is done: nothing to undo
        # the batch-end state a ModelCheckpoint writes here, less the weights (unchanged until the
        # next batch's first optimizer step, or put back by _undo_batch_updates): what an
        # abandoned batch or validation saves
        skips = getattr(pl_module, "skip_counts", None)
        self._last_batch_end = {
            "loops": copy.deepcopy(trainer._checkpoint_connector._get_loops_state_dict()),
            "rng_states": collect_rng_states(),
            "epoch": trainer.current_epoch,
            "global_step": trainer.global_step,
            **({"skipped_steps": copy.deepcopy(skips())} if callable(skips) else {}),
        }

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.state.fn != "fit" or trainer.sanity_checking:
            return
        if self._pending and trainer.world_size == 1:
            self._stop(trainer, "skipping this validation")
        self._abandonable = True

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._abandonable = False

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self._abandonable = False
        self._restore_handlers()
        if not isinstance(exception, SIGTERMException):
            release_run_folders()  # the fit is over: its folders are free (infra/run_lock.py)
            return
        exception.code = self._exit_code  # SIGTERMException is a SystemExit with status 0: say "stopped"
        phase_saved = self._phase is not None and self._phase[1]()
        if self._aborted and self._last_batch_end is None and not phase_saved:
            where = f"in {self._phase[0]}" if self._phase else "before the first batch of this fit ended"
            rank_zero_info(f"Interrupted {where}: nothing trained, nothing saved")
            release_run_folders()
            return
        if self._aborted:
            self._undo_batch_updates(trainer)
        checkpoint = trainer._checkpoint_connector.dump_checkpoint()
        if self._aborted and self._last_batch_end is not None:  # the counters and RNG of the batch end before
            checkpoint.update(self._last_batch_end)
        trainer.strategy.save_checkpoint(checkpoint, self.ckpt_path)
        trainer.strategy.barrier("InterruptCheckpoint.on_exception")
        rank_zero_info(
            f"Interrupted: saved {self.ckpt_path}; resume with: fit ... --ckpt_path {self.ckpt_path}"
        )
        release_run_folders()

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._restore_handlers()
        # Lightning calls callbacks' teardown only when fit ends normally (not after an exception)
        if stage == "fit" and self.dirpath is not None and os.path.exists(self.ckpt_path):
            trainer.strategy.remove_checkpoint(self.ckpt_path)

    def _restore_handlers(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for signum, previous in self._previous.items():
                signal.signal(signum, previous)
        self._previous = {}
