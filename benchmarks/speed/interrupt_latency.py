"""How fast SIGTERM saves when it lands in a batch's updates, after the first agent stepped, and how
fast it stops MARLHF's phase 1 (outside any batch).

Runs a tiny MAGRPO team (``builtin:tiny-gpt2``, CPU) twice in one process and prints:

- SIGTERM at agent 1's optimizer step of batch 2 with ``InterruptCheckpoint()``: seconds from the
  signal to the saved checkpoint (the batch's remaining updates run first: the callback keeps no copy
  to undo agent 0's step from);
- the median batch time of a run without a signal, for scale.
- MARLHF phase 1 (``--phase1``): SIGTERM at the first reward call of the preference-pair build, the
  reward taking ``--reward-s`` seconds per call (and one that hangs ``--hang-s``), and in the middle
  of the second reward-model epoch: seconds from the signal to the end of ``fit``, with the phase
  marked interruptible (``infra/interrupts.py``) and with that mark patched out (the behaviour
  before it: the signal waited for every pair and the first epoch).

    python benchmarks/speed/interrupt_latency.py [--iterations 4 --new-tokens 32 --batches 4] [--phase1]

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


def _fit(args: argparse.Namespace, at: int) -> tuple[_Clock, float]:
    pl.seed_everything(0)
    model = MAGRPO(
        agents="builtin:tiny-gpt2",
        num_agents=2,
        num_generations=4,
        max_new_tokens=args.new_tokens,
        learning_rate=1e-3,
        loss=LossConfig(num_iterations=args.iterations),
    )
    clock = _Clock(at)
    with tempfile.TemporaryDirectory() as folder:
        trainer = pl.Trainer(
            max_steps=MAGRPO.max_steps_for(args.batches, 2, args.iterations),
            accelerator="cpu",
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            callbacks=[InterruptCheckpoint(dirpath=folder), clock],
        )
        done = 0.0
        try:
            trainer.fit(model, LengthRatioDataModule(batch_size=4, num_train=4 * args.batches))
        except SystemExit:
            done = time.perf_counter()
    latency = (done - clock.sent_at) if clock.sent_at is not None else 0.0
    return clock, latency


def _phase1(where: str, reward_s: float, mark: bool) -> float:
    """Seconds from a SIGTERM in MARLHF's phase 1 (``where``: ``pairs``, at the first reward call of
    the build, each call taking ``reward_s``; ``epoch``, inside the second reward-model epoch) to the
    end of ``fit``; ``mark=False`` patches the interruptible mark out."""
    import contextlib

    from comlrl_lightning import MARLHF
    from comlrl_lightning.algorithms import joint_reward_model, marlhf
    from comlrl_lightning.envs.base import DecPOMDP

    sent: list[float] = []

    def term() -> None:
        sent.append(time.perf_counter())
        os.kill(os.getpid(), signal.SIGTERM)

    def slow_reward(joint_actions, episodes, turn):
        if where == "pairs" and not sent:
            term()
        time.sleep(reward_s)
        return [float(len(b) > len(a)) for a, b in joint_actions]

    scored, epochs, forwards = joint_reward_model.sequence_logits, [], []

    def forward(*args, **kwargs):  # a reward-model forward: the second one of epoch 1 sends it
        forwards.append(len(epochs))
        if where == "epoch" and forwards.count(1) == 2 and not sent:
            term()
        return scored(*args, **kwargs)

    pl.seed_everything(0)
    module = MARLHF(
        agents=["builtin:tiny-gpt2"] * 2,
        rollout=dict(num_generations=2),
        sampling=dict(max_new_tokens=8),
        reward_model=dict(reward_num_train_epochs=3, reward_train_batch_size=2),
        preference=dict(preference_num_candidates=3, preference_pairs_per_sample=2),
        pair_source=dict(preference_num_prompts=4, preference_batch_size=2),
    )
    module.after_reward_epoch = epochs.append
    data = LengthRatioDataModule(num_train=8, num_val=2, batch_size=2, seed=0)
    data.env = DecPOMDP(data.env.formatters, slow_reward)
    original = marlhf.interruptible
    joint_reward_model.sequence_logits = forward
    if not mark:
        marlhf.interruptible = lambda *args: contextlib.nullcontext()
    with tempfile.TemporaryDirectory() as folder:
        trainer = pl.Trainer(
            max_steps=MAGRPO.max_steps_for(1, 2),
            accelerator="cpu",
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            limit_val_batches=0,
            default_root_dir=folder,
            callbacks=[InterruptCheckpoint(dirpath=folder)],
        )
        try:
            trainer.fit(module, data)
        except SystemExit:
            pass
        finally:
            marlhf.interruptible, joint_reward_model.sequence_logits = original, scored
    return time.perf_counter() - sent[0]


def main_phase1(args: argparse.Namespace) -> None:
    cases = [
        (f"pair build, {args.reward_s:g} s reward", "pairs", args.reward_s),
        (f"pair build, reward hanging {args.hang_s:g} s", "pairs", args.hang_s),
        ("reward-model epoch 2 of 3", "epoch", 0.0),
    ]
    print(f"load (1 min) before MARLHF phase 1: {os.getloadavg()[0]:.2f}")
    for name, where, reward_s in cases:
        marked, unmarked = _phase1(where, reward_s, True), _phase1(where, reward_s, False)
        print(
            f"SIGTERM in MARLHF phase 1, {name} -> fit ends: {marked:.3f} s marked interruptible, "
            f"{unmarked:.3f} s unmarked (ratio {unmarked / max(marked, 1e-9):.1f}x); load {os.getloadavg()[0]:.2f}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--iterations", type=int, default=4, help="num_iterations (optimizer steps per agent)"
    )
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--phase1", action="store_true", help="time MARLHF's phase 1 instead")
    parser.add_argument("--reward-s", type=float, default=3.0, help="--phase1: seconds per reward call")
    parser.add_argument("--hang-s", type=float, default=20.0, help="--phase1: the hanging reward's seconds")
    args = parser.parse_args(argv)
    if args.phase1:
        main_phase1(args)
        return 0
    load = os.getloadavg()[0]
    _, finish_s = _fit(args, at=2)
    straight, _ = _fit(args, at=-1)
    print(f"load (1 min): {load:.2f} -> {os.getloadavg()[0]:.2f}")
    print(f"SIGTERM after agent 0's first step -> checkpoint saved: {finish_s:.3f} s")
    print(f"a batch without a signal (median): {sorted(straight.batch_s)[len(straight.batch_s) // 2]:.3f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
