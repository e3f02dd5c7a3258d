"""Per-agent rewards ([J] shared or [J, N]), `RewardModelReward` (sequence-classification head and
causal-LM judge: batched, frozen, composable) and the placement of critics and reward models on a
second device (played by ``meta``, as in test_strategy.py)."""

import pytest
import torch
from torch import nn

from comlrl_lightning.core.config import AdvantageConfig
from comlrl_lightning.core.records import Turn as Level
from comlrl_lightning.core.rollout import RolloutPlan, compute_advantages, compute_returns
from comlrl_lightning.envs.base import Episode
from comlrl_lightning.envs.reward_model import RewardModelReward, reward_models_of
from comlrl_lightning.envs.rewards import RewardError, WeightedReward
from comlrl_lightning.infra.strategy import place_module, plan_devices
from comlrl_lightning.team.agents import AgentSpec, byte_tokenizer, load_agent
from comlrl_lightning.team.critics import CriticSpec, load_critic

CPU, META = torch.device("cpu"), torch.device("meta")
JOINT = [["ab", "abcd"], ["a", "a"], ["abc", "ab"]]
EPS = [Episode(0, {"prompt": "p0"}), Episode(0, {"prompt": "p0"}), Episode(1, {"prompt": "p1"})]

MEAN_UNSCALED = AdvantageConfig(advantage_mode="mean", scale_rewards="none", advantage_eps=1e-4)


def fn(name, values):
    def f(joint_actions, episodes, turn):
        return values

    f.name = name
    return f


# ------------------------------------------------------------------ per-agent rewards
def test_per_agent_values_give_one_column_per_agent_and_shared_ones_broadcast():
    per_agent = fn("credit", [[1.0, 0.0], [0.5, 0.5], [0.0, 2.0]])
    shared = fn("team", [1.0, 2.0, 3.0])
    out = WeightedReward([per_agent, shared], weights=[2.0, 1.0])(JOINT, EPS, 0)
    assert out.per_agent and out.total.shape == (3, 2)
    assert out.total.tolist() == [[3.0, 1.0], [3.0, 3.0], [3.0, 7.0]]
    assert out.agent(1).tolist() == [1.0, 3.0, 7.0]
    assert out.components["credit"].shape == (3, 2) and out.components["team"].shape == (3,)
    only_shared = WeightedReward([shared])(JOINT, EPS, 0)
    assert (
        not only_shared.per_agent
        and only_shared.total.shape == (3,)
        and only_shared.agent(1).tolist() == [1, 2, 3]
    )
    with pytest.raises(RewardError, match=r"'t' failed.*returned a torch.Tensor \(shape \[3, 2\]\).*tolist"):
        WeightedReward([fn("t", torch.ones(3, 2))])(JOINT, EPS, 0)  # plain numbers only: said, not dropped


@pytest.mark.parametrize(
    "values,match",
    [
        (
            [[1.0, 0.0, 1.0]] * 3,
            r"'bad' failed.*shape \[3, 3\] for 3 joint actions of 2 agents; expected \[3\] \(shared\)",
        ),
        ([[1.0, 0.0], [1.0], [0.0, 0.0]], r"'bad' failed.*rows of different lengths \[2, 1, 2\]"),
        (
            [[1.0, 0.0], [1.0, float("nan")], [0.0, 0.0]],
            r"'bad' returned a non-finite value.*joint actions \[1\]",
        ),
        ([[1.0, "x"]] * 3, r"'bad' failed.*non-numeric value 'x'"),
    ],
)
def test_bad_per_agent_shapes_name_the_function_and_the_shape(values, match):
    with pytest.raises(RewardError, match=match):
        WeightedReward([fn("bad", values)])(JOINT, EPS, 0)


def test_magrpo_groups_per_agent_rewards_per_agent():
    # one node, K=2 aligned joint actions; agent 0 is credited for joint action 0, agent 1 for 1
    rewards = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])  # [G=1, J=2, N=2]
    level = Level(0, [], [], [], rewards, {}, torch.full((1, 2), -1))
    compute_returns([level], discount=0.5)
    compute_advantages([level], RolloutPlan(2), MEAN_UNSCALED, num_agents=2)
    assert level.advantages[0].tolist() == [0.5, -0.5] and level.advantages[1].tolist() == [-0.5, 0.5]


def test_per_agent_returns_discount_each_agents_child_mean():
    top = Level(0, [], [], [], torch.tensor([[[1.0, 0.0]]]), {}, torch.tensor([[0]]))  # G=1, J=1
    below = Level(1, [], [], [], torch.tensor([[[2.0, 4.0], [0.0, 2.0]]]), {}, torch.full((1, 2), -1))  # J=2
    compute_returns([top, below], discount=0.5)
    assert top.returns.tolist() == [[[1.0 + 0.5 * 1.0, 0.0 + 0.5 * 3.0]]]


# ------------------------------------------------------------------ reward models
@pytest.fixture(scope="module")
def classifier_dir(tmp_path_factory):
    from transformers import GPT2Config, GPT2ForSequenceClassification

    torch.manual_seed(0)
    tok = byte_tokenizer()
    config = GPT2Config(vocab_size=len(tok), n_positions=256, n_embd=32, n_layer=1, n_head=2, num_labels=1,
                        pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)  # fmt: skip
    path = tmp_path_factory.mktemp("rm") / "classifier"
    model = GPT2ForSequenceClassification(config)
    nn.init.normal_(model.score.weight)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def judge_dir(tmp_path_factory):
    model, tok = load_agent(AgentSpec("builtin:tiny-gpt2"))
    path = tmp_path_factory.mktemp("rm") / "judge"
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_classifier_scores_are_batched_frozen_and_independent_of_padding(classifier_dir):
    rm = RewardModelReward(str(classifier_dir), template="{prompt}|{joint_action}", batch_size=2)
    scores = rm(JOINT, EPS, 0)
    one_by_one = RewardModelReward(str(classifier_dir), template="{prompt}|{joint_action}", batch_size=1)(
        JOINT, EPS, 0
    )
    assert len(scores) == 3 and scores == pytest.approx(one_by_one, abs=1e-5)
    assert len({round(s, 5) for s in scores}) == 3  # different joint actions, different scores
    assert not rm.model.training and not any(p.requires_grad for p in rm.model.parameters())
    # the score is the head's logit on the rendered text
    text = rm.render(JOINT[0], EPS[0], 0)
    assert text == "p0|Agent 0:\nab\n\nAgent 1:\nabcd"
    with torch.no_grad():
        enc = rm._tokenizer([text], return_tensors="pt")
        assert float(rm.model(**enc).logits[0, 0]) == pytest.approx(scores[0], abs=1e-5)


def test_reward_model_composes_with_a_programmatic_reward(classifier_dir):
    rm = RewardModelReward(str(classifier_dir), name="rm")
    scores = torch.tensor(rm(JOINT, EPS, 0))
    out = WeightedReward([rm, fn("length", [1.0, 0.0, 2.0])], weights=[0.5, 2.0])(JOINT, EPS, 0)
    assert out.total.tolist() == pytest.approx(
        (0.5 * scores + 2.0 * torch.tensor([1.0, 0.0, 2.0])).tolist(), abs=1e-5
    )
    assert out.components["rm"].tolist() == pytest.approx(scores.tolist(), abs=1e-6)
    assert reward_models_of(WeightedReward([fn("a", [0.0] * 3), rm])) == [rm]


def test_causal_lm_judge_scores_the_yes_probability_against_no(judge_dir):
    judge = RewardModelReward(
        str(judge_dir), kind="causal_lm", template="{joint_action} ok?", positive="y", negative="n"
    )
    scores = judge(JOINT, EPS, 0)
    assert all(0.0 < s < 1.0 for s in scores)
    tok = judge._tokenizer
    y, n = (
        tok("y", add_special_tokens=False)["input_ids"][0],
        tok("n", add_special_tokens=False)["input_ids"][0],
    )
    with torch.no_grad():
        # ByT5 appends EOS to every encoding; the judge's text must end in the question, not EOS
        ids = tok([judge.render(JOINT[2], EPS[2], 0)], add_special_tokens=False, return_tensors="pt")[
            "input_ids"
        ]
        logits = judge.model(input_ids=ids).logits[0, -1]
    assert scores[2] == pytest.approx(float(logits[[y, n]].softmax(-1)[0]), abs=1e-5)
    same = RewardModelReward(
        str(judge_dir), kind="causal_lm", positive=" yes", negative=" no"
    )  # bytes: both start ' '
    with pytest.raises(ValueError, match="must start with different tokens"):
        same.load()


def test_reward_model_config_errors_come_before_loading():
    with pytest.raises(
        ValueError, match=r"RewardModelReward.kind: got 'regression', allowed: \['sequence_classification'"
    ):
        RewardModelReward("/does/not/exist", kind="regression")
    with pytest.raises(ValueError, match="RewardModelReward.batch_size: got 0"):
        RewardModelReward("/does/not/exist", batch_size=0)
    rm = RewardModelReward("/does/not/exist", template="{answer}")
    assert rm._model is None  # nothing loaded at construction
    with pytest.raises(
        KeyError, match=r"uses field 'answer'.*available: \['completion_0', 'completion_1', 'joint_action'"
    ):
        rm.render(["a", "b"], Episode(0), 0)


# ------------------------------------------------------------------ placement
class Team(nn.Module):
    """The lists a LightningModule exposes to the strategy (agents, critics, reward_models)."""

    def __init__(self, agents, critics, reward_models):
        super().__init__()
        self.agents, self.critics, self.reward_models = (
            nn.ModuleList(m) for m in (agents, critics, reward_models)
        )
        self.head = nn.Linear(2, 2)


def test_critics_and_reward_models_go_to_their_own_device(classifier_dir):
    agents = [load_agent(AgentSpec("builtin:tiny-gpt2"))[0] for _ in range(2)]
    critics = [load_critic(CriticSpec(model="builtin:tiny-gpt2"))[0] for _ in range(2)]
    rm = RewardModelReward(str(classifier_dir))
    team = Team(agents, critics, [rm.model])
    plan = plan_devices(team, ["cpu", "cpu"], critic_devices=["cpu", "meta"], reward_devices=["meta"])
    assert plan.critics == [CPU, META] and plan.rewards == [META]
    place_module(team, plan)
    assert {p.device for a in team.agents for p in a.parameters()} == {CPU}
    assert {p.device for p in team.critics[0].parameters()} == {CPU}
    assert {p.device for p in team.critics[1].parameters()} == {META}
    assert {p.device for p in rm.model.parameters()} == {
        META
    }  # the reward function scores where its model is
    assert team.head.weight.device == CPU


def test_head_on_the_trunk_critics_default_to_their_agents_device():
    from comlrl_lightning.core.value_head import ValueHead

    agents = [load_agent(AgentSpec("builtin:tiny-gpt2"))[0] for _ in range(2)]
    team = Team(agents, [ValueHead(64), ValueHead(64)], [])
    plan = plan_devices(team, ["cpu", "meta"])
    assert plan.critics == [CPU, META] and plan.rewards == []
    place_module(team, plan)
    assert team.critics[1].out.weight.device == META and team.critics[0].out.weight.device == CPU


def _per_agent_level():
    # one node, K=3 aligned joint actions; the agents' rewards differ in scale
    rewards = torch.tensor([[[1.0, 0.0], [0.0, 10.0], [2.0, 20.0]]])  # [G=1, J=3, N=2]
    level = Level(0, [], [], [], rewards, {}, torch.full((1, 3), -1))
    compute_returns([level], discount=1.0)
    return level


def test_per_agent_rewards_subtract_the_kl_cost_before_the_baseline():
    # kl_mode="reward" with per-agent rewards: each agent's β·KL is subtracted from its own column
    level = _per_agent_level()
    costs = [[torch.tensor([[0.5, 0.0, 0.25]]), torch.tensor([[1.0, 2.0, 3.0]])]]
    compute_advantages([level], RolloutPlan(3), MEAN_UNSCALED, num_agents=2, sample_costs=costs)
    shaped0, shaped1 = torch.tensor([0.5, 0.0, 1.75]), torch.tensor([-1.0, 8.0, 17.0])
    assert torch.allclose(level.agent_returns[0], shaped0) and torch.allclose(level.agent_returns[1], shaped1)
    assert torch.allclose(level.advantages[0], shaped0 - shaped0.mean())
    assert torch.allclose(level.advantages[1], shaped1 - shaped1.mean())


@pytest.mark.parametrize("agent_wise", [True, False])
def test_per_agent_rewards_follow_agent_wise_normalization(agent_wise):
    level = _per_agent_level()
    cfg = AdvantageConfig(advantage_mode="mean", scale_rewards="group", agent_wise_normalization=agent_wise)
    compute_advantages([level], RolloutPlan(3), cfg, num_agents=2)
    r0, r1 = torch.tensor([1.0, 0.0, 2.0]), torch.tensor([0.0, 10.0, 20.0])
    s0, s1 = (r0.std(), r1.std()) if agent_wise else (torch.cat([r0, r1]).std(),) * 2
    assert torch.allclose(level.advantages[0], (r0 - r0.mean()) / (s0 + 1e-4))
    assert torch.allclose(level.advantages[1], (r1 - r1.mean()) / (s1 + 1e-4))


@pytest.mark.parametrize("credit", ["counterfactual", "cross_rewards"])
@pytest.mark.parametrize("num_turns", [1, 2])
def test_per_agent_rewards_with_a_credit_mode_credit_each_agent_on_its_own_column(credit, num_turns):
    # before: RuntimeError (size of tensor a (4) must match ... b (2)) in core/credit.py
    from comlrl_lightning.core.credit import credit_index

    k, idx = 2, credit_index(2, 2, credit)
    m = idx.num_reward_calls
    gen = torch.Generator().manual_seed(0)
    col = [torch.rand(1, m, generator=gen), torch.rand(1, m, generator=gen) * 10]  # agent 1's column differs
    below = [torch.rand(k, m, generator=gen), torch.rand(k, m, generator=gen)]

    def levels(agent_rewards):  # agent_rewards(t) -> [G, M] or [G, M, N]
        top = Level(
            0,
            [],
            [],
            [],
            agent_rewards(0)[:, :k],
            {},
            torch.tensor([[0, 1]]) if num_turns > 1 else torch.full((1, k), -1),
        )
        out = [top]
        top.scored_rewards = agent_rewards(0)
        if num_turns > 1:
            nxt = Level(1, [], [], [], agent_rewards(1)[:, :k], {}, torch.full((k, k), -1))
            nxt.scored_rewards = agent_rewards(1)
            out.append(nxt)
        return out

    def run(agent_rewards, cfg):
        turns = levels(agent_rewards)
        compute_returns(turns, discount=0.5, credit=credit)
        compute_advantages(turns, RolloutPlan(k, num_turns, credit=credit), cfg, num_agents=2)
        return turns

    both = run(
        lambda t: torch.stack([col[0], col[1]], -1) if t == 0 else torch.stack(below, -1), MEAN_UNSCALED
    )
    for i in range(2):  # each agent's advantages are those of a shared reward equal to its column
        alone = run(lambda t, i=i: col[i] if t == 0 else below[i], MEAN_UNSCALED)
        for b, a in zip(both, alone):
            assert torch.allclose(b.advantages[i], a.advantages[i], atol=1e-6)
    assert not torch.allclose(both[0].advantages[0], both[0].advantages[1])
