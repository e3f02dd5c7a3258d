"""benchmarks/learning.py: exact-match checking, the held-out split, the bootstrap."""

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import learning as L  # noqa: E402

from comlrl_lightning.envs.base import Episode  # noqa: E402
from comlrl_lightning.envs.rewards import PASS_AT_1  # noqa: E402


def test_held_out_problems_are_never_training_problems():
    for task in L.TASKS:
        held, train = L.held_out_and_train(task)
        assert len(held) == L.NUM_HELD_OUT and len({str(r) for r in held}) == L.NUM_HELD_OUT
        assert len(train) == L.NUM_TRAIN and not [r for r in train if r in held]


def test_exact_match_needs_every_agent_right_and_checks_the_stated_integer():
    ep = Episode(0, {"answers": [21, 12]})
    only, last = L.ExactMatchReward("pair", "only"), L.ExactMatchReward("pair", "last")
    joint = [["21", "12."], ["7 × 3 = 21", "12"], ["21", "13"], ["To solve this", "3 × 4"]]
    r = only(joint, [ep] * 4, 0)
    assert r.values == [1.0, 0.5, 0.5, 0.0] and r.metrics[PASS_AT_1] == [1.0, 0.0, 0.0, 0.0]
    r = last(joint, [ep] * 4, 0)
    assert r.values == [1.0, 1.0, 0.5, 0.0] and r.metrics[PASS_AT_1] == [1.0, 1.0, 0.0, 0.0]
    split = L.ExactMatchReward("split", "only")(
        [["30", "33"], ["30", "30"], ["thirty", "33"]], [Episode(0, {"n": 63})] * 3, 0
    )
    assert split.values == [1.0, 0.0, 0.0]


def test_bootstrap_counts_each_held_out_problem_once_however_many_seeds_score_it():
    # 200 problems of 0/1 outcomes, 30% solved, scored identically by 3 seeds: the interval of the mean must
    # have the width of 200 problems' binomial noise, sqrt(p(1-p)/200), not of 600 independent ones
    problems = [1.0 if (i * 7) % 10 < 3 else 0.0 for i in range(200)]
    lo, hi = L.hierarchical_bootstrap([problems] * 3, reps=4000)
    assert lo < 0.3 < hi
    assert (hi - lo) == pytest.approx(2 * 1.96 * math.sqrt(0.3 * 0.7 / 200), rel=0.15)
    assert L.hierarchical_bootstrap([[0.5] * 10] * 3, reps=100) == (0.5, 0.5)  # no variation: no width
    # seeds that disagree widen it beyond the problems' noise
    lo2, hi2 = L.hierarchical_bootstrap([[0.0] * 200, [0.3] * 200, [0.6] * 200], reps=4000)
    assert hi2 - lo2 > 0.3


def test_summary_and_render_report_the_gain_and_whether_its_interval_excludes_zero():
    def run(seed, before, after):
        return {
            "algorithm": "magrpo",
            "seed": seed,
            "wall_s": 60.0,
            "loadavg_start": [3.0],
            "loadavg_end": [4.0],
            "final_texts": [],
            "history": [{"samples": 0, "solved": before}, {"samples": 96, "solved": after}],
        }

    before = [1.0] * 20 + [0.0] * 30
    runs = [run(s, before, [1.0] * 35 + [0.0] * 15) for s in range(3)]
    summ = L.summarize(runs)["magrpo"]
    assert summ["before"] == pytest.approx(0.4) and summ["after"] == pytest.approx(0.7)
    assert summ["gain"] == pytest.approx(0.3) and 0 < summ["gain_ci"][0] < 0.3 < summ["gain_ci"][1]
    res = {
        "task": L.TASK,
        "rule": L.TASK_RULE,
        "calibration": {2: {L.TASK: 0.42}},
        "config": L.CONFIG,
        "summary": {"magrpo": summ},
        "png": "x.png",
    }
    text = L.render(res)
    assert "| MAGRPO | 3 | 96 | 40.0%" in text and "+30.0 pts" in text and "**excludes 0**" in text
    assert "Not run in the recorded budget: IAC, MAAC, CENTRALIZED_MAGRPO." in text


def test_the_centralized_row_gets_the_agents_token_budget_plus_the_tags_and_reports_parse_failures():
    module = L.build_module("centralized_magrpo", L.TASK, L.CONFIG)  # built, not loaded
    assert type(module).__name__ == "CentralizedMAGRPO" and module.num_agents == 1 and module.num_roles == 2
    assert module.team.sampling[0].max_new_tokens == 2 * 8 + L.TAG_TOKENS == 41

    def run(seed, fails):
        return {
            "algorithm": "centralized_magrpo",
            "seed": seed,
            "wall_s": 60.0,
            "loadavg_start": [3.0],
            "loadavg_end": [4.0],
            "final_texts": [],
            "max_new_tokens": 41,
            "history": [
                {"samples": 0, "solved": [0.0] * 4, "parse_failure": fails[0]},
                {"samples": 16, "solved": [0.0] * 4, "parse_failure": fails[1]},
            ],
        }

    summ = L.summarize([run(0, [1.0, 0.5]), run(1, [1.0, 0.25])])
    assert summ["centralized_magrpo"]["parse_failure"] == [1.0, 0.375]
    assert "at each evaluation: 100%, 38%." in L._central(summ) and L._central({}) == ""
    assert "degenerate" in L._central(summ)  # nothing solved before or after: say what the row can mean
    probe = {
        "temperature": 0.7,
        "problems": 24,
        "samples": 96,
        "failures": 95,
        "wall_s": 280.0,
        "loadavg": [[6.7], [7.1]],
    }
    assert "95 of 96 held no tagged section" in L._central(summ, probe)
