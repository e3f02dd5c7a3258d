"""Credit modes through the rollout and the module: reward calls, aligned expansion, returns, the step."""

import torch

from comlrl_lightning import MAGRPO
from comlrl_lightning.core.config import AdvantageConfig, LossConfig, RolloutConfig
from comlrl_lightning.core.generation import Generation
from comlrl_lightning.core.rollout import (
    RolloutPlan,
    compute_advantages,
    compute_returns,
    independent_action,
    rollout_tree,
)
from comlrl_lightning.datamodules import LengthRatioDataModule
from comlrl_lightning.envs.base import DecPOMDP, Episode

K = 2

MEAN_UNSCALED = AdvantageConfig(advantage_mode="mean", scale_rewards="none", advantage_eps=1e-4)


def path(text):
    """'E>01>11' -> [1, 1]: the sample index the agent drew at each turn."""
    return [int(seg[1]) for seg in text.split(">")[1:]]


class Recorder:
    """A team and env whose texts record each agent's sample path; counts generate and reward calls."""

    def __init__(self, k=K):
        self.k, self.generate_calls, self.reward_calls = k, [], []

    act = independent_action

    def render(self, agent, node):
        return node.prompts[agent][-1]

    def generate(self, prompts, num_generations, greedy=False):
        self.generate_calls.append([len(p) for p in prompts])
        gens = []
        for i, agent_prompts in enumerate(prompts):
            texts = [f"{p}>{i}{k}" for p in agent_prompts for k in range(num_generations)]
            z, o = torch.zeros(len(texts), 1, dtype=torch.long), torch.ones(len(texts), 1, dtype=torch.long)
            gens.append(Generation(z, o, z, o, texts, torch.zeros(len(texts), dtype=torch.bool)))
        return gens

    def reward(self, joint_actions, episodes, turn):
        self.reward_calls.append((turn, len(joint_actions)))
        out = []
        for texts in joint_actions:
            p = [path(t) for t in texts]
            if turn == 0:
                out.append(sum((i + 1) * q[0] for i, q in enumerate(p)) + 1.0)  # a + 2b (+ 3c) + 1
            else:
                out.append(10.0 * (p[0][0] * self.k + p[1][0] + 1) + p[0][1] + p[1][1])

        return out

    def transition(self, episode, turn, prompts, completions):
        return [c[-1] for c in completions]


def run(credit, num_turns=2, num_agents=2, k=K, episodes=1):
    rec = Recorder(k)
    env = DecPOMDP(["E"] * num_agents, rec.reward, rec.transition)
    plan = RolloutPlan(k, num_turns, "aligned", credit=credit)
    turns = rollout_tree(env, [Episode(i) for i in range(episodes)], rec, plan)
    compute_returns(turns, 0.5, credit)
    compute_advantages(turns, plan, MEAN_UNSCALED, num_agents)
    return rec, turns


def test_cross_rewards_scores_every_combination_but_expands_only_the_aligned_ones():
    rec, turns = run("cross_rewards")
    assert rec.reward_calls == [(0, 4), (1, 8)]  # K^N per node; 2 nodes at turn 1, not 4
    assert rec.generate_calls == [[1, 1], [2, 2]]  # aligned-mode generation
    # rows (0,0), (1,1), (0,1), (1,0); reward a + 2b + 1
    assert turns[0].scored_rewards.tolist() == [[1.0, 4.0, 3.0, 2.0]]
    assert turns[0].rewards.tolist() == [[1.0, 4.0]]  # what is logged: the played joint actions
    assert turns[1].rewards.tolist() == [[10.0, 12.0], [40.0, 42.0]]
    # MAGRPO returns of the played joint actions are unchanged: r + 0.5 * child value (11, 41)
    assert turns[0].returns.tolist() == [[6.5, 24.5]]
    # every combination's continuation is the mean child value (11 + 41) / 2 = 26 -> + 13
    assert turns[0].scored_returns.tolist() == [[14.0, 17.0, 16.0, 15.0]]
    # agent 0: sample 0 in (0,0),(0,1) -> 15, sample 1 -> 16; agent 1: 14.5 and 16.5
    assert turns[0].advantages[0].tolist() == [-0.5, 0.5]
    assert turns[0].advantages[1].tolist() == [-1.0, 1.0]


def test_counterfactual_through_the_rollout_keeps_the_played_future():
    _, turns = run("counterfactual")
    # rows (0,0), (1,1), then agent 0's swap (1,0) and agent 1's swap (0,1); the aligned rows keep
    # 6.5 and 24.5, the swapped ones get r + 13: 2 + 13 and 3 + 13
    assert turns[0].scored_returns.tolist() == [[6.5, 24.5, 15.0, 16.0]]
    # agent 0 at k=0: 6.5 - (6.5 + 15)/2; at k=1: 24.5 - (16 + 24.5)/2
    assert turns[0].advantages[0].tolist() == [-4.25, 4.25]
    assert turns[0].advantages[1].tolist() == [-4.75, 4.75]


def test_counterfactual_reward_calls_for_three_agents():
    rec, turns = run("counterfactual", num_turns=1, num_agents=3, k=3, episodes=2)
    assert rec.reward_calls == [(0, 2 * 21)]  # 3 aligned + 3 agents x 3 x 2 swaps per node
    assert turns[0].rewards.shape == (2, 3)
    assert RolloutConfig(num_generations=3, credit="counterfactual").reward_calls_per_episode(3) == 21


def test_shared_credit_rollout_is_unchanged():
    rec, turns = run("shared")
    assert rec.reward_calls == [(0, 2), (1, 4)] and turns[0].scored_rewards is None
    assert turns[0].returns.tolist() == [[6.5, 24.5]]


def test_one_step_with_credit_loss_type_and_kl_reward_trains_every_agent(trainer_factory):
    __import__("lightning").seed_everything(0, verbose=False)
    got = {}

    class Grab(__import__("lightning").pytorch.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            got.update(outputs)

    model = MAGRPO(
        agents="builtin:tiny-gpt2", num_agents=2, learning_rate=1e-3,
        rollout=RolloutConfig(num_generations=3, credit="counterfactual"),
        advantage=AdvantageConfig(scale_rewards="batch"),
        loss=LossConfig(loss_type="dr_grpo", beta=0.1, kl_mode="reward", num_iterations=2, delta=3.0,
                        importance_sampling_level="sequence"),
    )  # fmt: skip
    model.team.sampling = [type(s)(**{**vars(s), "max_new_tokens": 8}) for s in model.team.sampling]
    before = None

    class Snap(__import__("lightning").pytorch.Callback):
        def on_train_start(self, trainer, pl_module):
            nonlocal before
            before = [[p.detach().clone() for p in a.parameters()] for a in pl_module.agents]

    trainer_factory(max_steps=2 * 2, callbacks=[Grab(), Snap()]).fit(
        model, LengthRatioDataModule(batch_size=2, num_train=4)
    )
    assert got["rewards"].shape == (2 * 3,)  # only the played (aligned) joint actions are reported
    for s in got["agent_stats"]:
        assert s.entropy > 0 and s.kl == 0.0  # kl_mode="reward": no KL term in the loss
    model.loss.mask_truncated_completions = True  # 8 tokens: the tiny model's completions rarely end in EOS
    trainer_factory(max_steps=2 * 2, callbacks=[Grab()]).fit(
        model, LengthRatioDataModule(batch_size=2, num_train=4)
    )
    # only completions with an EOS reach the loss: an agent whose every completion was cut has no
    # gradient (the converse does not hold: its EOS-ended completions may all have advantage 0)
    for clipped, s in zip(got["clipped"], got["agent_stats"]):
        if bool(clipped.all()):
            assert s.grad_norm == 0.0
    assert any(bool(c.all()) for c in got["clipped"]), "seed 0: an agent with every completion cut"
    for b, agent in zip(before, model.agents):
        assert any(not torch.equal(x, p) for x, p in zip(b, agent.parameters()))
        assert all(torch.isfinite(p).all() for p in agent.parameters())


def test_per_agent_rewards_with_kl_as_reward_subtract_each_agents_kl_cost(trainer_factory):
    # before the fix the per-agent branch dropped the β·KL cost (and kl_mode="reward" turns the loss
    # KL off), so no KL regularisation happened: each agent's returns equalled its reward column
    from comlrl_lightning.datamodules import DecPOMDPDataModule

    def per_agent(joint_actions, episodes, turn):  # [J, N]: each agent scored on its own length
        return [[float(len(a)), -float(len(b))] for a, b in joint_actions]

    class Probe(MAGRPO):
        def score_turns(self, turns, plan, evaluation):
            super().score_turns(turns, plan, evaluation)
            self.seen = turns

    class Perturb(__import__("lightning").pytorch.Callback):
        def on_train_start(self, trainer, pl_module):  # a reference the policy differs from: KL > 0
            with torch.no_grad():
                for ref in pl_module.reference_models:
                    for p in ref.parameters():
                        p.add_(torch.randn_like(p) * 0.5)

    loss = LossConfig(beta=0.5, kl_mode="reward")
    model = Probe(
        agents="builtin:tiny-gpt2", num_agents=2, rollout=RolloutConfig(num_generations=3), loss=loss
    )
    model.team.sampling = [type(s)(**{**vars(s), "max_new_tokens": 6}) for s in model.team.sampling]
    rows = [{"topic": t} for t in ("tea", "rain")]
    dm = DecPOMDPDataModule(rows, ["A {topic}:", "B {topic}:"], per_agent, batch_size=1)
    trainer_factory(max_steps=2, callbacks=[Perturb()]).fit(model, dm)
    turn = model.seen[0]
    assert turn.returns.dim() == 3
    for i in range(2):
        column = turn.returns[0, :, i]  # aligned joint action k = agent i's sample k
        cost = column - turn.agent_returns[i]
        assert (cost > 0).all(), f"agent {i}: no β·KL subtracted"


def test_a_step_with_per_agent_rewards_and_counterfactual_credit_trains(trainer_factory):
    # before: RuntimeError "The size of tensor a (4) must match the size of tensor b (2)" at step one
    from comlrl_lightning.datamodules import DecPOMDPDataModule

    def per_agent(joint_actions, episodes, turn):
        return [[float(len(a)), -float(len(b))] for a, b in joint_actions]

    model = MAGRPO(
        agents="builtin:tiny-gpt2",
        num_agents=2,
        rollout=RolloutConfig(num_generations=2, credit="counterfactual"),
    )
    model.team.sampling = [type(s)(**{**vars(s), "max_new_tokens": 4}) for s in model.team.sampling]
    dm = DecPOMDPDataModule([{"topic": "tea"}] * 2, ["A {topic}:", "B {topic}:"], per_agent, batch_size=1)
    trainer_factory(max_steps=2).fit(model, dm)
    assert model.trainer.global_step == 2
