import math

import pytest
import torch

from comlrl_lightning.envs.base import Episode
from comlrl_lightning.envs.rewards import RewardError, RewardProcessor, WeightedReward
from comlrl_lightning.envs.toy import LengthRatioReward

EPS = [Episode(0), Episode(0)]


def const(name, values):
    def fn(joint_actions, episodes, turn):
        return values

    fn.name = name
    return fn


def test_weighted_sum_and_components():
    wr = WeightedReward([const("a", [1.0, 2.0]), const("b", [10.0, 0.0])], weights=[2.0, 0.5])
    out = wr([["x"], ["y"]], EPS, 0)
    assert out.total.tolist() == [7.0, 4.0]
    assert out.components["a"].tolist() == [1.0, 2.0] and out.components["b"].tolist() == [10.0, 0.0]


def test_processor_scales_shifts_then_clips():
    wr = WeightedReward(
        [const("a", [1.0, 5.0])], processor=RewardProcessor(scale=2.0, shift=-1.0, clip_max=4.0)
    )
    assert wr([["x"], ["y"]], EPS, 0).total.tolist() == [1.0, 4.0]


@pytest.mark.parametrize(
    "fn,msg",
    [
        (const("nan_fn", [1.0, float("nan")]), "'nan_fn' returned a non-finite value at step 7"),
        (const("short_fn", [1.0]), "'short_fn' failed at step 7.*returned 1 values for 2"),
        (const("dict_fn", {0.5: "a", 1.0: "b"}), "'dict_fn' failed.*returned a dict"),
        (const("str_fn", ["1.0", "2"]), "'str_fn' failed.*non-numeric value '1.0'"),
    ],
)
def test_bad_reward_fails_loudly_with_name_and_step(fn, msg):
    with pytest.raises(RewardError, match=msg):
        WeightedReward([fn])([["x"], ["y"]], EPS, 0, step=7)


def test_raising_reward_names_the_function():
    def broken(joint_actions, episodes, turn):
        raise KeyError("boom")

    with pytest.raises(RewardError, match="'broken' failed at step 3"):
        WeightedReward([broken])([["x"]], EPS[:1], 0, step=3)


def test_skip_invalid_counts_and_assigns_the_invalid_reward():
    wr = WeightedReward([const("a", [1.0, float("nan")])], skip_invalid=True, invalid_reward=-1.0)
    out = wr([["x"], ["y"]], EPS, 0)
    assert out.total.tolist() == [1.0, -1.0]
    assert wr.num_invalid == 1
    assert math.isnan(out.components["a"][1])


def test_weight_count_mismatch_names_the_field():
    with pytest.raises(ValueError, match="WeightedReward.weights"):
        WeightedReward([const("a", [1.0])], weights=[1.0, 2.0])


def test_length_ratio_reward_is_one_inside_the_band_and_decays_outside():
    r = LengthRatioReward(2.0, 3.0)
    assert r.score("ab", "abcde") == 1.0  # ratio 2.5
    assert math.isclose(r.score("ab", "ab"), math.exp(-1.0))  # ratio 1, distance 1 to the band
    assert math.isclose(r.score("a", "abcdef"), math.exp(-3.0))  # ratio 6
    assert torch.tensor(r([["ab", "abcde"], ["ab", "ab"]], EPS, 0)).tolist()[0] == 1.0


def test_reward_result_metrics_are_logged_as_components():
    from comlrl_lightning.envs.rewards import RewardResult

    def fn(joint_actions, episodes, turn):
        return RewardResult([1.0, 0.0], {"all_passed": [1.0, 0.0]})

    fn.name = "r"
    out = WeightedReward([fn])([["x"], ["y"]], EPS, 0)
    assert out.total.tolist() == [1.0, 0.0] and out.components["r/all_passed"].tolist() == [1.0, 0.0]


def test_pass_at_1_is_the_declared_metric_not_a_name_suffix():
    from comlrl_lightning.envs.rewards import PASS_AT_1, RewardResult

    def solved(joint_actions, episodes, turn):
        return RewardResult([2.0, 0.5], {"level": [1.0, 1.0], PASS_AT_1: [1.0, 0.0]})

    def plain(joint_actions, episodes, turn):
        return RewardResult([0.0, 0.0], {"level/all_passed_like": [1.0, 1.0]})

    solved.name, plain.name = "s", "p"
    assert WeightedReward([plain, solved])([["x"], ["y"]], EPS, 0).pass_at_1.tolist() == [1.0, 0.0]
    assert WeightedReward([plain])([["x"], ["y"]], EPS, 0).pass_at_1 is None


# ------------------------------------------------------------------ TRL-style rewards
def test_trl_rewards_get_trl_keyword_arguments_and_map_agents_as_documented():
    from comlrl_lightning.envs import Episode, TRLReward
    from comlrl_lightning.envs.rewards import WeightedReward

    calls = []

    def accuracy(prompts, completions, completion_ids, answer, **kwargs):
        calls.append({"prompts": prompts, "completions": completions, "ids": completion_ids, "answer": answer,
                      **kwargs})  # fmt: skip
        return [float(c == a) if a is not None else None for c, a in zip(completions, answer)]

    episodes = [Episode(0, {"prompt": "2+2?", "answer": "4", "level": 1}),
                Episode(1, {"prompt": "3+3?", "answer": None, "level": 2})]  # fmt: skip
    joint = [["4", "5"], ["6", "6"]]
    each = WeightedReward([TRLReward(accuracy)])(joint, episodes, 0)
    assert each.total.tolist() == [[1.0, 0.0], [0.0, 0.0]]  # [J, N]: agent i's column; None -> 0.0
    assert calls[0] == {"prompts": ["2+2?", "3+3?"], "completions": ["4", "6"], "ids": None, "answer": ["4", None],
                        "level": [1, 2]}  # fmt: skip
    assert calls[1]["completions"] == ["5", "6"]
    assert TRLReward(accuracy, agent=1)(joint, episodes, 0) == [0.0, 0.0]
    assert calls[-1]["completions"] == ["5", "6"]
    TRLReward(accuracy, agent="joined", separator="|")(joint, episodes, 0)
    assert calls[-1]["completions"] == ["4|5", "6|6"]
    chat = [Episode(0, {"prompt": [{"role": "user", "content": "2+2?"}], "answer": "4"})]
    TRLReward(accuracy, agent=0)([["4", "x"]], chat, 0)
    assert calls[-1]["completions"] == [[{"role": "assistant", "content": "4"}]]  # TRL's conversational form
    with pytest.raises(IndexError, match="TRLReward.agent: got 2; the joint actions have 2 agents"):
        TRLReward(accuracy, agent=2)(joint, episodes, 0)


def test_trl_reward_completion_ids_come_from_the_given_tokenizer():
    from comlrl_lightning.envs import Episode, TRLReward
    from comlrl_lightning.team.builtin import resolve_model_spec

    seen = []

    def length(prompts, completions, completion_ids, **kwargs):
        seen.append(completion_ids)
        return [float(len(ids)) for ids in completion_ids]

    reward = TRLReward(length, agent=0, tokenizer=resolve_model_spec("builtin:gpt2-tokenizer"))
    assert reward([["hello world", "x"]], [Episode(0, {"prompt": "p"})], 0) == [2.0]
    assert seen[0] == [[31373, 995]]  # GPT-2 BPE: "hello", " world"
