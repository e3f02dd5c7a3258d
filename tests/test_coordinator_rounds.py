"""The coordinator's round protocol with scripted players: routing, joint responses, returns, advantages."""

import pytest
import torch

from comlrl_lightning.coordinator.rounds import Stage, play_round
from comlrl_lightning.core.advantages import group_advantages
from comlrl_lightning.core.generation import Generation
from comlrl_lightning.envs.base import Episode
from comlrl_lightning.envs.rewards import WeightedReward


class Scripted:
    """Answers prompt p with ``"<name>(<prompt>)#i"`` for its i-th sample; records the prompts it saw."""

    def __init__(self, name, k=2):
        self.name, self.num_generations, self.seen = name, k, []

    def render(self, prompt):
        return f"<{prompt}>"

    def generate(self, rendered, k):
        self.seen.append(list(rendered))
        texts = [f"{self.name}({p})#{i}" for p in rendered for i in range(k)]
        n = len(texts)
        ones = torch.ones(n, 1, dtype=torch.long)
        return Generation(ones, ones, ones, ones, texts, torch.zeros(n, dtype=torch.bool))

    def advantages(self, returns):
        return group_advantages(returns, "mean", "none")


def score_by_sample_index(joint, episodes, turn):
    """Reward = 10·(stage 0's sample index) + (last stage's sample index) + 100·episode index."""
    return [10 * int(j[0][-1]) + int(j[-1][-1]) + 100 * ep.index for j, ep in zip(joint, episodes)]


EPISODES = [Episode(0, {"q": "x"}), Episode(1, {"q": "y"})]


def test_aligned_round_pairs_the_jth_responses_and_later_stages_see_earlier_ones():
    a, b = Scripted("a"), Scripted("b")
    out = play_round(0, [Stage("a", "Q {q}"), Stage("b", "fix {a}")], EPISODES, {"a": a, "b": b},
                     WeightedReward([score_by_sample_index]))  # fmt: skip
    assert a.seen == [["<Q x>", "<Q y>"]]  # one prompt per episode, K samples each
    assert b.seen == [["<fix a(<Q x>)#0>", "<fix a(<Q x>)#1>", "<fix a(<Q y>)#0>", "<fix a(<Q y>)#1>"]]
    assert out.joint_responses[1] == ["a(<Q x>)#1", "b(<fix a(<Q x>)#1>)#0"]
    assert out.episode_indices == [0, 0, 1, 1]
    # b answered each partial joint response once, so its sample index is always 0
    assert out.rewards.tolist() == [0.0, 10.0, 100.0, 110.0]
    ea, eb = out.experiences["a"][0], out.experiences["b"][0]
    assert ea.generation.texts == [j[0] for j in out.joint_responses]
    assert eb.generation.texts == [j[1] for j in out.joint_responses]
    assert ea.returns.tolist() == [[0.0, 10.0], [100.0, 110.0]] == eb.returns.tolist()
    assert ea.advantages.tolist() == [-5.0, 5.0, -5.0, 5.0]
    assert ea.episode_indices == [0, 0, 1, 1]
    assert eb.prompt_texts[1] == "<fix a(<Q x>)#1>"


def test_cross_round_expands_a_tree_and_a_response_returns_the_mean_of_its_descendants():
    a, b = Scripted("a"), Scripted("b")
    out = play_round(3, [Stage("a", "Q {q}"), Stage("b", "fix {a}")], EPISODES[:1], {"a": a, "b": b},
                     WeightedReward([score_by_sample_index]), joint_mode="cross")  # fmt: skip
    assert b.seen == [["<fix a(<Q x>)#0>", "<fix a(<Q x>)#1>"]]  # K answers per draft
    assert [j[1][-1] for j in out.joint_responses] == ["0", "1", "0", "1"]
    assert out.rewards.tolist() == [0.0, 1.0, 10.0, 11.0]
    ea, eb = out.experiences["a"][0], out.experiences["b"][0]
    assert ea.returns.tolist() == [[0.5, 10.5]]  # each draft: mean over its 2 revisions
    assert eb.returns.tolist() == [[0.0, 1.0], [10.0, 11.0]]  # one group per draft
    assert eb.advantages.tolist() == [-0.5, 0.5, -0.5, 0.5]
    assert eb.prompt_texts == ["<fix a(<Q x>)#0>"] * 2 + ["<fix a(<Q x>)#1>"] * 2


def test_a_learner_answering_two_stages_gets_one_experience_per_stage():
    a = Scripted("a")
    out = play_round(0, [Stage("a", "Q {q}"), Stage("a", "again {a}")], EPISODES, {"a": a},
                     WeightedReward([score_by_sample_index]))  # fmt: skip
    assert [e.stage for e in out.experiences["a"]] == [0, 1]


@pytest.mark.parametrize("stages, players, mode, message", [
    ([Stage("z", "{q}")], {"a": Scripted("a")}, "aligned", r"stages\[0\].learner: got 'z'"),
    ([Stage("a", "{q}")], {"a": Scripted("a"), "b": Scripted("b")}, "aligned", r"\['b'\] answer in no stage"),
    ([Stage("a", "{q}"), Stage("b", "{a}")], {"a": Scripted("a", 2), "b": Scripted("b", 3)}, "aligned",
     "the same K"),
    ([Stage("a", "{q}")], {"a": Scripted("a")}, "diagonal", r"joint_mode: got 'diagonal'"),
])  # fmt: skip
def test_bad_routing_is_refused_naming_the_field(stages, players, mode, message):
    with pytest.raises(ValueError, match=message):
        play_round(0, stages, EPISODES, players, WeightedReward([score_by_sample_index]), joint_mode=mode)


def test_a_template_field_that_nothing_provides_names_the_available_fields():
    with pytest.raises(KeyError, match=r"\{draft\}; available: \['a', 'q'\]"):
        play_round(0, [Stage("a", "{q}"), Stage("b", "{draft}")], EPISODES, {"a": Scripted("a"), "b": Scripted("b")},
                   WeightedReward([score_by_sample_index]))  # fmt: skip
