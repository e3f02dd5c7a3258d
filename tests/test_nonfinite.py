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


def poison_agent_1_once(monkeypatch):
    """Agent 1's gradients become NaN in its first backward only."""
    real, calls = MAGRPO._backward, []

    def backward(self, agent, batches):
        stats = real(self, agent, batches)
        if agent == 1 and not calls:
            calls.append(agent)
            next(p for p in self.agents[1].parameters() if p.grad is not None).grad.fill_(float("nan"))
        return stats

    monkeypatch.setattr(MAGRPO, "_backward", backward)


def test_a_nan_gradient_skips_that_agents_step_only_and_is_counted(monkeypatch, trainer_factory):
    poison_agent_1_once(monkeypatch)
    model = tiny()
    trainer = trainer_factory(max_steps=1)  # agent 0 steps (global_step 1), agent 1 is skipped
    with pytest.warns(
        UserWarning, match=r"agent 1: non-finite loss .* or gradient norm \(nan\) at epoch 0, batch 0"
    ):
        trainer.fit(model, LengthRatioDataModule(batch_size=2, num_train=8))
    assert model.skipped_steps == [0, 1]
    assert trainer.global_step == 1  # the skipped step is not counted
    assert trainer.callback_metrics["agent_1/skipped_steps"] == 1.0
    assert trainer.callback_metrics["agent_0/skipped_steps"] == 0.0
    assert all(torch.isfinite(p).all() for m in model.agents for p in m.parameters())


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
