"""The seam for how a team acts (``CoMLRLModule.actors``, ``core/rollout.Actors``): an algorithm
built outside the package, in the lines between the markers below (at most 60), trains through it."""

import inspect
from dataclasses import replace  # the algorithm's imports: replace, MAGRPO, TeamAction, TurnState

import pytest
import torch

from comlrl_lightning import MAGRPO, RolloutConfig
from comlrl_lightning.core.records import TeamAction, TurnState
from comlrl_lightning.datamodules import LengthRatioDataModule

# --- the algorithm: sequential agents, each seeing its teammates' completions of the same sample ---


class SequentialActors:
    """Agent 0 samples K completions per node; agent i > 0 then writes one completion per row
    ``g·K + k``, its prompt extended by agents 0..i−1's completions of that same sample k."""

    def __init__(self, team):
        self.team = team

    def act(self, state: TurnState) -> TeamAction:
        k, prompts, gens = state.num_generations, [], []
        for i in range(self.team.num_agents):
            if i == 0:
                rows, per_row = [self.team.render(0, node) for node in state.nodes], k
            else:
                nodes = [node for node in state.nodes for _ in range(k)]  # row g·K + k
                rows = [self.team.render(i, self.seeing(node, i, gens, r)) for r, node in enumerate(nodes)]
                per_row = 1
            gens.append(self.team.generate_one(i, rows, per_row, state.greedy))
            prompts.append(rows)
        return TeamAction(prompts, gens)

    @staticmethod
    def seeing(node, agent, gens, row):
        """``node`` with agent ``agent``'s last prompt followed by its teammates' completions of ``row``."""
        seen = "".join(f"\nAgent {j} wrote: {gens[j].texts[row]}" for j in range(agent))
        prompts = [list(p) for p in node.prompts]
        prompts[agent][-1] += seen
        return replace(node, prompts=prompts)


class SequentialMAGRPO(MAGRPO):
    """MAGRPO whose agents act in order; the group is still the K rows of a node."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.rollout_config.joint_mode != "aligned":
            raise ValueError(
                f"joint_mode: got {self.rollout_config.joint_mode!r}; sequential agents see the same "
                "sample of their teammates, so they need joint_mode='aligned'"
            )

    @property
    def actors(self):
        return SequentialActors(self.team)


# --- end of the algorithm ---


def test_the_sequential_algorithm_fits_in_sixty_lines():
    source = inspect.getsource(inspect.getmodule(test_the_sequential_algorithm_fits_in_sixty_lines))
    start, end = source.index("# --- the algorithm"), source.index("# --- end of the algorithm")
    assert len(source[start:end].strip().splitlines()) <= 60


def test_sequential_agents_see_their_teammates_sample_and_train_two_steps(trainer_factory):
    got, before = {}, None

    class Grab(__import__("lightning").pytorch.Callback):
        def on_train_start(self, trainer, pl_module):
            nonlocal before
            before = [[p.detach().clone() for p in a.parameters()] for a in pl_module.agents]

    model = SequentialMAGRPO(
        agents="builtin:tiny-gpt2", num_agents=2, learning_rate=1e-2, rollout=RolloutConfig(num_generations=3)
    )
    model.team.sampling = [type(s)(**{**vars(s), "max_new_tokens": 8}) for s in model.team.sampling]
    update = model.update_agents  # what the update trains on: the rolled-out turns
    model.update_agents = lambda turns: (got.__setitem__("turns", turns), update(turns))[1]
    trainer = trainer_factory(max_steps=2 * 2, callbacks=[Grab()])
    trainer.fit(model, LengthRatioDataModule(batch_size=2, num_train=4))
    assert trainer.global_step == 4  # two batches, one step per agent each
    turn = got["turns"][0]
    first, second = turn.generations
    assert (
        len(turn.prompt_texts[0]) == 2 and len(turn.prompt_texts[1]) == 2 * 3
    )  # agent 1: one prompt per row
    for r in range(2 * 3):  # row g·K + k of agent 1 conditioned on agent 0's sample k at node g
        assert turn.prompt_texts[1][r].endswith(f"Agent 0 wrote: {first.texts[r]}")
        assert turn.prompt_texts[1][r].startswith(turn.nodes[r // 3].prompts[1][-1])
    # the loss trains on those prompts: agent 1's prompt tokens hold agent 0's completion of the row
    tok = model.tokenizers[1]
    for r in range(2 * 3):
        ids = second.prompt_ids[r][second.prompt_mask[r].bool()]
        assert tok.decode(ids).endswith(first.texts[r]) or not first.texts[r]
    assert turn.advantages[1].shape == (2 * 3,) and torch.isfinite(turn.advantages[1]).all()
    for b, agent in zip(before, model.agents):
        assert any(not torch.equal(x, p) for x, p in zip(b, agent.parameters()))


def test_sequential_agents_refuse_cross_joint_actions():
    with pytest.raises(ValueError, match="joint_mode: got 'cross'.*joint_mode='aligned'"):
        SequentialMAGRPO(agents="builtin:tiny-gpt2", num_agents=2, rollout=RolloutConfig(joint_mode="cross"))
