"""Slow: the toy length-coordination team learns (fixed seed)."""

import statistics

import lightning.pytorch as pl
import pytest

from comlrl_lightning import MAGRPO
from comlrl_lightning.datamodules import LengthRatioDataModule


@pytest.mark.slow
def test_toy_team_reward_rises(trainer_factory):
    pl.seed_everything(0)
    rewards = []

    class Record(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            rewards.append(float(outputs["rewards"].mean()))

    model = MAGRPO(
        agents="builtin:tiny-gpt2", num_agents=2, num_generations=4, max_new_tokens=48, learning_rate=1e-3
    )
    trainer = trainer_factory(max_steps=MAGRPO.max_steps_for(150, 2), callbacks=[Record()])
    trainer.fit(model, LengthRatioDataModule(batch_size=4, num_train=1024))
    n = len(rewards) // 5
    first, last = statistics.mean(rewards[:n]), statistics.mean(rewards[-n:])
    print(f"toy reward first 20%: {first:.3f}  last 20%: {last:.3f}")
    assert last > first + 0.2


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["IAC", "MAAC"])
def test_actor_critic_team_reward_rises(trainer_factory, algorithm):
    from comlrl_lightning import IAC, MAAC, ActorCriticRolloutConfig, CriticConfig, SamplingConfig

    cls = IAC if algorithm == "IAC" else MAAC
    pl.seed_everything(0)
    rewards = []

    class Record(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            rewards.append(float(outputs["rewards"].mean()))

    model = cls(agents="builtin:tiny-gpt2", num_agents=2, critic=CriticConfig(critic_learning_rate=1e-3),
                rollout=ActorCriticRolloutConfig(num_generations=4), sampling=SamplingConfig(max_new_tokens=48),
                learning_rate=1e-3)  # fmt: skip
    batches = 60
    trainer = trainer_factory(max_steps=cls.max_steps_for(batches, 2, num_critics=len(model.separate_critics)),
                              callbacks=[Record()])  # fmt: skip
    trainer.fit(model, LengthRatioDataModule(batch_size=4, num_train=4 * batches))
    n = len(rewards) // 5
    first, last = statistics.mean(rewards[:n]), statistics.mean(rewards[-n:])
    print(f"{algorithm} toy reward first 20%: {first:.3f}  last 20%: {last:.3f}")
    assert len(rewards) == batches and last >= first + 0.1
