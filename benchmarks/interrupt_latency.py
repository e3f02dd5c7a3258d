"""How fast SIGTERM saves when it lands in a batch's updates, after the first agent stepped.

Runs a tiny MAGRPO team (``builtin:tiny-gpt2``, CPU) three ways in one process and prints:

- ``undo``: SIGTERM at agent 1's optimizer step of batch 2 with ``InterruptCheckpoint()`` (agent 0's
  update is undone): seconds from the signal to the saved checkpoint;
- ``finish``: the same with ``InterruptCheckpoint(undo_updates=False)`` (the batch's remaining
  updates run first);
- the ratio finish / undo, and the cost of the copies: seconds spent copying over the batch time
  of a run without a signal (timed inside ``InterruptCheckpoint.on_before_optimizer_step``, so the
  ratio holds under load; whole-batch times of two runs on a shared machine differ more than that).

    python benchmarks/interrupt_latency.py [--iterations 4 --new-tokens 32 --batches 4]

Absolute times depend on the load; the script prints ``os.getloadavg()`` beside them.
"""

from __future__ import annotations

import argparse
import os
import signal
import tempfile
import time

import lightning.pytorch as pl

from comlrl_lightning import MAGRPO
from comlrl_lightning.callbacks import InterruptCheckpoint
from comlrl_lightning.core.config import LossConfig
from comlrl_lightning.datamodules import LengthRatioDataModule


class _TimedInterruptCheckpoint(InterruptCheckpoint):
    """``InterruptCheckpoint`` that adds up the seconds its copies take."""

    copy_s = 0.0

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        t0 = time.perf_counter()
        super().on_before_optimizer_step(trainer, pl_module, optimizer)
        self.copy_s += time.perf_counter() - t0


class _Clock(pl.Callback):
    """Sends SIGTERM at the ``nth`` optimizer step of batch ``at`` (never when ``at`` < 0) and times batches."""

    def __init__(self, at: int, nth: int = 2) -> None:
        self.at, self.nth, self.steps, self.batch = at, nth, 0, -1
        self.sent_at: float | None = None
        self.batch_s: list[float] = []
        self._t0 = 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.batch, self.steps, self._t0 = self.batch + 1, 0, time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.batch_s.append(time.perf_counter() - self._t0)

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.steps += 1
        if self.batch == self.at and self.steps == self.nth and self.sent_at is None:
            self.sent_at = time.perf_counter()
            os.kill(os.getpid(), signal.SIGTERM)


def _fit(args: argparse.Namespace, undo: bool, at: int) -> tuple[_Clock, float, float]:
    pl.seed_everything(0)
    model = MAGRPO(
        agents="builtin:tiny-gpt2",
        num_agents=2,
        num_generations=4,
        max_new_tokens=args.new_tokens,
        learning_rate=1e-3,
        loss=LossConfig(num_iterations=args.iterations),
    )
    clock, saver = _Clock(at), None
    with tempfile.TemporaryDirectory() as folder:
        trainer = pl.Trainer(
            max_steps=MAGRPO.max_steps_for(args.batches, 2, args.iterations),
            accelerator="cpu",
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            callbacks=[saver := _TimedInterruptCheckpoint(dirpath=folder, undo_updates=undo), clock],
        )
        done = 0.0
        try:
            trainer.fit(model, LengthRatioDataModule(batch_size=4, num_train=4 * args.batches))
        except SystemExit:
            done = time.perf_counter()
    latency = (done - clock.sent_at) if clock.sent_at is not None else 0.0
    return clock, latency, saver.copy_s


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--iterations", type=int, default=4, help="num_iterations (optimizer steps per agent)"
    )
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--batches", type=int, default=4)
    args = parser.parse_args(argv)
    load = os.getloadavg()[0]
    _, undo_s, _ = _fit(args, undo=True, at=2)
    _, finish_s, _ = _fit(args, undo=False, at=2)
    with_copies, _, copy_s = _fit(args, undo=True, at=-1)
    print(f"load (1 min): {load:.2f}")
    print(
        f"SIGTERM after agent 0's first step -> checkpoint saved: undo {undo_s:.3f} s, finish {finish_s:.3f} s"
    )
    print(f"ratio finish / undo: {finish_s / max(undo_s, 1e-9):.2f}")
    print(f"copy time / batch time: {copy_s / sum(with_copies.batch_s):.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
