"""Memory the trainer holds between steps (issue 12 §5: peak RSS of the main job)."""

from comlrl_lightning import MAGRPO
from comlrl_lightning.datamodules import LengthRatioDataModule


def test_no_agent_keeps_gradients_after_its_optimizer_step(trainer_factory):
    # a gradient kept until the agent's next zero_grad is alive during every other agent's backward
    model = MAGRPO(agents="builtin:tiny-gpt2", num_agents=2, num_generations=2, max_new_tokens=6, learning_rate=1e-3)
    trainer_factory(max_steps=MAGRPO.max_steps_for(2, 2)).fit(model, LengthRatioDataModule(batch_size=2, num_train=8))
    assert model.global_step == 4
    assert all(p.grad is None for p in model.agents.parameters())
