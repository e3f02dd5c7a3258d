"""Non-finite loss or gradients skip the agent's step or stop the run; NaN weights are never saved
(issue 12 B5)."""

import pytest
import torch

from comlrl_lightning import MAGRPO
from comlrl_lightning.core.config import LossConfig
from comlrl_lightning.datamodules import LengthRatioDataModule


def tiny(**loss):
    return MAGRPO(agents="builtin:tiny-gpt2", num_agents=2, num_generations=2, max_new_tokens=8,
                  learning_rate=1e-2, loss=LossConfig(**loss))  # fmt: skip


def poison_once(monkeypatch, cls, method, owner, index, value):
    """After the first ``cls.method(self, index, ...)`` call, one gradient of ``self.<owner>[index]``
    becomes ``value`` (the loss that call returns is left as it was)."""
    real, calls = getattr(cls, method), []

    def wrapped(self, which, *args, **kwargs):
        out = real(self, which, *args, **kwargs)
        if which == index and not calls:
            calls.append(which)
            module = getattr(self, owner)[index]
            next(p for p in module.parameters() if p.grad is not None).grad.fill_(value)
        return out

    monkeypatch.setattr(cls, method, wrapped)


def poison_agent_1_once(monkeypatch):
    """Agent 1's gradients become NaN in its first backward only."""
    poison_once(monkeypatch, MAGRPO, "_backward", "agents", 1, float("nan"))


def test_a_nan_gradient_skips_that_agents_step_only_and_is_counted(monkeypatch, trainer_factory):
    poison_agent_1_once(monkeypatch)
    model = tiny()
    trainer = trainer_factory(max_steps=2)  # one batch: agent 0 steps, agent 1 is skipped
    with pytest.warns(
        UserWarning, match=r"agent 1: non-finite loss .* or gradient norm \(nan\) at epoch 0, batch 0"
    ):
        trainer.fit(model, LengthRatioDataModule(batch_size=2, num_train=8))
    assert model.skipped_steps == [0, 1]
    assert trainer.global_step == 2  # the skipped step still counts: the cadence is unchanged
    assert trainer.callback_metrics["z_agent_1/skipped_steps"] == 1.0
    assert trainer.callback_metrics["z_agent_0/skipped_steps"] == 0.0
    assert all(torch.isfinite(p).all() for m in model.agents for p in m.parameters())


def test_a_skip_keeps_every_checkpoint_of_a_clean_run_and_max_steps(monkeypatch, trainer_factory, tmp_path):
    """One skipped step (agent 1, batch 0) shifts neither global_step nor ModelCheckpoint's
    every_n_train_steps cadence nor where max_steps stops: the same checkpoints as a clean run."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    def fit(folder):
        every = ModelCheckpoint(dirpath=folder, every_n_train_steps=4, save_top_k=-1, save_last=False)
        trainer = trainer_factory(max_steps=16, enable_checkpointing=True, callbacks=[every])
        trainer.fit(tiny(), LengthRatioDataModule(batch_size=2, num_train=32))
        return trainer, {p.name for p in folder.iterdir()}

    clean_trainer, clean = fit(tmp_path / "clean")
    poison_agent_1_once(monkeypatch)
    with pytest.warns(UserWarning, match="agent 1: non-finite"):
        trainer, written = fit(tmp_path / "skip")
    assert clean == {f"epoch=0-step={s}.ckpt" for s in (4, 8, 12, 16)}
    assert written == clean
    assert trainer.global_step == clean_trainer.global_step == 16
    assert trainer.fit_loop.epoch_loop.batch_progress.total.completed == 8  # 8 batches, not 9


def test_stop_raises_naming_the_agent_and_batch(monkeypatch, trainer_factory):
    poison_agent_1_once(monkeypatch)
    with pytest.raises(
        FloatingPointError, match=r"agent 1: non-finite .* at epoch 0, batch 0.*on_nonfinite='stop'"
    ):
        trainer_factory(max_steps=2).fit(
            tiny(on_nonfinite="stop"), LengthRatioDataModule(batch_size=2, num_train=8)
        )
    with pytest.raises(ValueError, match=r"on_nonfinite: got 'ignore'.*'skip', 'stop'"):
        LossConfig(on_nonfinite="ignore")


def test_a_checkpoint_of_nan_weights_is_refused():
    model = tiny()
    model.configure_model()
    model.on_save_checkpoint({})  # finite: fine
    with torch.no_grad():
        next(model.agents[1].parameters()).view(-1)[0] = float("inf")
    with pytest.raises(
        FloatingPointError, match=r"agent 1: parameter .* holds NaN/inf.*refusing to write a checkpoint"
    ):
        model.on_save_checkpoint({})


def test_skipped_steps_survive_a_checkpoint_and_resume(monkeypatch, trainer_factory, tmp_path):
    poison_agent_1_once(monkeypatch)
    first = tiny()
    trainer = trainer_factory(max_steps=2, default_root_dir=tmp_path)
    with pytest.warns(UserWarning, match="agent 1: non-finite"):
        trainer.fit(first, LengthRatioDataModule(batch_size=2, num_train=8))
    trainer.save_checkpoint(tmp_path / "after_skip.ckpt")
    resumed = tiny()
    trainer = trainer_factory(max_steps=4, default_root_dir=tmp_path)  # one more batch: agent 1 steps now
    trainer.fit(
        resumed, LengthRatioDataModule(batch_size=2, num_train=8), ckpt_path=tmp_path / "after_skip.ckpt"
    )
    assert resumed.skipped_steps == [0, 1]  # went on from the saved count, not from 0
    assert trainer.callback_metrics["z_agent_1/skipped_steps"] == 1.0


# ---------------------------------------------------------------- separate critics (IAC)
def iac(**loss):
    from comlrl_lightning import IAC, ActorCriticRolloutConfig, CriticConfig, CriticSpec, SamplingConfig

    return IAC(agents="builtin:tiny-gpt2", num_agents=2, critics=CriticSpec(model="builtin:tiny-gpt2"),
               critic=CriticConfig(critic_learning_rate=1e-2), rollout=ActorCriticRolloutConfig(num_generations=2),
               sampling=SamplingConfig(max_new_tokens=8), learning_rate=1e-3, loss=LossConfig(**loss))  # fmt: skip


def poison_critic_0_once(monkeypatch):
    """Critic 0's gradients become inf after its first value backward (its loss stays finite)."""
    from comlrl_lightning import IAC

    poison_once(monkeypatch, IAC, "_value_backward", "critics", 0, float("inf"))


def test_a_separate_critics_inf_gradient_skips_its_step_only(monkeypatch, trainer_factory):
    from comlrl_lightning import IAC

    poison_critic_0_once(monkeypatch)
    model = iac()
    trainer = trainer_factory(max_steps=IAC.max_steps_for(1, 2, num_critics=2))  # one batch, skip included
    with pytest.warns(
        UserWarning, match=r"critic 0: non-finite loss .* or gradient norm \(inf\) at epoch 0, batch 0"
    ):
        trainer.fit(model, LengthRatioDataModule(batch_size=2, num_train=8))
    assert model.critic_skipped_steps == [1, 0] and model.skipped_steps == [0, 0]
    assert trainer.callback_metrics["critic/agent_0/skipped_steps"] == 1.0
    assert all(torch.isfinite(p).all() for p in model.critics.parameters())


def test_a_separate_critics_non_finite_value_stops_naming_the_critic(monkeypatch, trainer_factory):
    from comlrl_lightning import IAC

    poison_critic_0_once(monkeypatch)
    with pytest.raises(
        FloatingPointError, match=r"critic 0: non-finite .* at epoch 0, batch 0.*on_nonfinite='stop'"
    ):
        trainer_factory(max_steps=IAC.max_steps_for(1, 2, num_critics=2)).fit(
            iac(on_nonfinite="stop"), LengthRatioDataModule(batch_size=2, num_train=8)
        )


def test_a_checkpoint_of_a_critic_with_nan_weights_is_refused():
    model = iac()
    model.configure_model()
    model.on_save_checkpoint({})
    with torch.no_grad():
        next(model.critics[1].parameters()).view(-1)[0] = float("nan")
    with pytest.raises(FloatingPointError, match=r"critic 1: parameter .* holds NaN/inf.*refusing to write"):
        model.on_save_checkpoint({})


def test_skip_counts_of_another_module_kind_are_warned_about_not_fatal():
    model = tiny()
    with pytest.warns(UserWarning, match=r"skipped_steps\['critics'\] has 2 entries, this module has 0"):
        model.on_load_checkpoint({"skipped_steps": {"agents": [0, 3], "critics": [1, 1]}})
    assert model.skipped_steps == [0, 3]
