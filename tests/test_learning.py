"""Slow: the toy length-coordination team learns (fixed seed)."""

import statistics

import lightning.pytorch as pl
import pytest
from comlrl_lightning.datamodules import LengthRatioDataModule

from comlrl_lightning import MAGRPO


@pytest.mark.slow
def test_toy_team_reward_rises(trainer_factory):
    pl.seed_everything(0)
    rewards = []

    class Record(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            rewards.append(float(outputs["rewards"].mean()))

    model = MAGRPO(agents="builtin:tiny-gpt2", num_agents=2, num_generations=4, max_new_tokens=48, learning_rate=1e-3)
    trainer = trainer_factory(max_steps=MAGRPO.max_steps_for(150, 2), callbacks=[Record()])
    trainer.fit(model, LengthRatioDataModule(batch_size=4, num_train=1024))
    n = len(rewards) // 5
    first, last = statistics.mean(rewards[:n]), statistics.mean(rewards[-n:])
    print(f"toy reward first 20%: {first:.3f}  last 20%: {last:.3f}")
    assert last > first + 0.2
