"""`InterruptCheckpoint`: SIGTERM or Ctrl+C ends fit with the last whole batch's resumable checkpoint and a non-zero exit."""

from __future__ import annotations

import copy
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

import lightning.pytorch as pl
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
    """Turns SIGTERM and the first Ctrl+C into "save the state at the last batch boundary, exit non-zero".

    Lightning alone notes a SIGTERM, stops at the end of the batch with ``SIGTERMException`` (a
    ``SystemExit`` whose status is 0) and saves nothing; a signal that lands in a long generation, a
    hanging reward or a validation epoch waits for all of it. With this callback:

    - SIGTERM: a full checkpoint (agents, optimizers, schedulers, RNG, loop and data position) of
      the state at a batch boundary is written to ``<dirpath>/<filename>.ckpt`` and the process
      exits with status 143 (128 + 15). ``fit --ckpt_path <that file>`` resumes exactly: the resumed
      run equals one that never stopped.
    - A signal before a training batch's first optimizer step (its generation, reward, the first
      agent's backward) or in a validation run inside fit abandons that work at once (the handler
      raises there): nothing of the agents has changed since the batch before ended, and the
      checkpoint is that batch end, the same state a ``ModelCheckpoint(every_n_train_steps)``
      writes there.
    - A signal after the batch's first optimizer step (some agents stepped, others not) lets the
      batch's remaining updates run, and the checkpoint is written at its end: the state after this
      batch. The wait is the rest of one batch's update phase; the rollout and the reward are done
      by then (every trainer generates and scores a batch before its first optimizer step), so no
      generation or reward call can hold it up. Measured (first optimizer step to batch end,
      ``benchmarks/speed/interrupt_memory.py``, in RESULTS.md): the main job 13-26 s on 2 shared CPU cores
      at load 5-8 (one torch thread), its LoRA team 6-9 s, a tiny team 0.6 s
      (``benchmarks/speed/interrupt_latency.py``); on a GPU an update phase is far shorter. A scheduler
      that kills a fixed time after SIGTERM (Slurm's ``KillWait``, 30 s by default) can be asked
      for the signal ahead of the time limit instead (``#SBATCH --signal=TERM@120``).

      Why finish instead of undoing the stepped agents: an undo needs the state before the first
      step, and nothing on hand holds it. Keeping it means a second copy of every trained parameter
      and of its optimizer state through every batch's updates (AdamW: three times the weights;
      the main job, 2 batches: peak RSS 7.43 GB against 4.58 GB without the callback; on a GPU,
      device memory the agents cannot use), paid every batch for a signal that comes once in a run. The previous boundary writes
      nothing either (the main job disables checkpointing), and writing the weights and optimizer
      state there would put the same bytes on disk every batch. Finishing costs no memory, and the
      batch it saves is whole: one batch later than an undo would have saved.
    - Under a multi-process strategy every rank finishes its batch (an abandoned collective would
      hang the others), then saves.
    - A second signal (SIGTERM again or Ctrl+C) before the checkpoint is written stops at once and
      saves nothing (the batch may be half updated), exit 143 / 130: the way out of updates that
      take too long. A checkpoint left by an earlier interruption stays as it was.
    - The first Ctrl+C (SIGINT) does what SIGTERM does, with status 130.
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

    Raises:
        ValueError: an empty ``filename``.
    """

    unknown_key_hints: ClassVar[dict[str, str]] = {
        "undo_updates": "removed: no copy of the weights is kept to undo a half-done batch any more; a signal "
        "after a batch's first optimizer step lets its updates finish and saves its end (docs/training.md)"
    }
    """Keys of earlier versions, with what replaced them (the CLI's "no such key" line adds the text)."""

    def __init__(self, dirpath: str | None = None, filename: str = "interrupted") -> None:
        super().__init__()
        if not filename:
            raise ValueError("InterruptCheckpoint.filename: must not be empty")
        self.dirpath, self.filename = dirpath, filename
        self._exit_code = EXIT_SIGTERM
        self._previous: dict[int, Any] = {}
        self._abandonable = False  # before a batch's first optimizer step or in validation: raise at once
        self._pending = False  # a signal came while the work could not be abandoned
        self._aborted = False  # the handler raised: the live loop state is not a batch end
        self._half_done = False  # a second signal stopped a batch's updates part-way: save nothing
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
        self._exit_code, self._aborted, self._half_done, self._phase = EXIT_SIGTERM, False, False, None
        self._pending = trainer.received_sigterm  # a signal in the sanity check: stop at once
        self._last_batch_end = None
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                self._previous[signum] = signal.signal(signum, self._make_handler(trainer, signum))

    def _make_handler(self, trainer: pl.Trainer, signum: int) -> Any:
        previous = signal.getsignal(signum)
        name = "Ctrl+C" if signum == signal.SIGINT else "SIGTERM"

        def handler(num: int, frame: Any) -> None:
            self._exit_code = EXIT_SIGINT if signum == signal.SIGINT else EXIT_SIGTERM
            if signum == signal.SIGTERM and callable(previous):
                previous(num, frame)  # Lightning's notifier (kills launched children, tells other ranks)
            trainer._signal_connector.received_sigterm = True  # Lightning's own stop-at-batch-end flag
            if self._pending:  # the second signal: the user will not wait for the batch to finish
                self._half_done, self._abandonable = True, False
                rank_zero_info(
                    f"\n{name} again: stopping now, saving nothing (the batch may be half updated)"
                )
                raise SIGTERMException(self._exit_code)
            if self._abandonable and trainer.world_size == 1:
                what = (
                    self._phase[0]
                    if self._phase
                    else "the current batch (no agent stepped yet) or validation"
                )
                self._stop(trainer, f"abandoning {what}")
            self._pending = True
            rank_zero_info(
                f"\n{name}: finishing the current batch's updates, then saving a checkpoint "
                "(SIGTERM or Ctrl+C again: stop now, saving nothing)"
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
        # the batch's first parameter change: from here the batch-end state before is gone (no copy
        # is kept: see the class docstring), so a signal lets the batch's updates finish
        self._abandonable = False

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._abandonable = False
        # the batch-end state a ModelCheckpoint writes here, less the weights and optimizer state
        # (unchanged until the next batch's first optimizer step): what an abandoned batch or
        # validation saves
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
        if self._half_done:
            earlier = (
                f"; {self.ckpt_path} is an earlier interruption's" if os.path.exists(self.ckpt_path) else ""
            )
            rank_zero_info(f"Interrupted twice: stopped inside a batch, nothing saved{earlier}")
            release_run_folders()
            return
        phase_saved = self._phase is not None and self._phase[1]()
        if self._aborted and self._last_batch_end is None and not phase_saved:
            where = f"in {self._phase[0]}" if self._phase else "before the first batch of this fit ended"
            rank_zero_info(f"Interrupted {where}: nothing trained, nothing saved")
            release_run_folders()
            return
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
