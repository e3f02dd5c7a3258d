"""The seam for how a team acts (``CoMLRLModule.actors``, ``core/rollout.Actors``): an algorithm
built outside the package, in the lines between the markers below (at most 60), trains through it."""

import inspect
from dataclasses import (
    replace,
)  # the algorithm's imports: replace, MAGRPO, TeamAction, TurnState, refuse_unsupported

import pytest
import torch

from comlrl_lightning import MAGRPO, RolloutConfig
from comlrl_lightning.core.records import TeamAction, TurnState
from comlrl_lightning.core.rollout import refuse_unsupported, rollout_tree
from comlrl_lightning.datamodules import LengthRatioDataModule

# --- the algorithm: sequential agents, each seeing its teammates' completions of the same sample ---


class SequentialActors:
    """Agent 0 samples K completions per node; agent i > 0 then writes one completion per row
    ``g·K + k``, its prompt extended by agents 0..i−1's completions of that same sample k."""

    why = "agent i's row k is conditioned on its teammates' sample k: combining other samples breaks that"
    rollout_limits = {"joint_mode": (("aligned",), why), "credit": (("shared",), why)}

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
        cfg = self.rollout_config  # the actors' own limits, before any model loads
        refuse_unsupported(SequentialActors, cfg.joint_mode, cfg.credit)

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


@pytest.mark.parametrize(("field", "value"), [("joint_mode", "cross"), ("credit", "counterfactual")])
def test_sequential_agents_refuse_what_their_actors_declare(field, value):
    with pytest.raises(
        ValueError, match=rf"rollout.{field}: got '{value}', allowed: \['(aligned|shared)'\]; agent i's row k"
    ):
        SequentialMAGRPO(agents="builtin:tiny-gpt2", num_agents=2, rollout=RolloutConfig(**{field: value}))


class _Env:
    num_agents = 2

    def observe(self, episode, agent):
        return "p"


def test_actors_see_the_credit_mode_and_a_rollout_refuses_what_they_cannot_act_in():
    from comlrl_lightning.core.rollout import RolloutPlan

    seen = []

    class Stop(Exception):
        pass

    class Watching:
        def act(self, state):
            seen.append((state.credit, state.joint_mode))
            raise Stop

    plan = RolloutPlan.of(
        RolloutConfig(credit="counterfactual", num_generations=2), evaluation=False, greedy=False
    )
    with pytest.raises(Stop):
        rollout_tree(_Env(), [None], Watching(), plan)
    assert seen == [("counterfactual", "aligned")]
    limited = Watching()
    limited.rollout_limits = {
        "credit": (("shared",), "it cannot")
    }  # a module that never checked: refused here
    with pytest.raises(
        ValueError, match=r"rollout.credit: got 'counterfactual', allowed: \['shared'\]; it cannot"
    ):
        rollout_tree(_Env(), [None], limited, plan)
    assert len(seen) == 1
    limited.rollout_limits = {"num_turns": ((1,), "one turn")}  # a limit nobody reads is refused, not ignored
    with pytest.raises(ValueError, match=r"Watching.rollout_limits: unknown fields \['num_turns'\]"):
        rollout_tree(_Env(), [None], limited, plan)
