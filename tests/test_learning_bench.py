"""benchmarks/learning/learning.py (and its modules ``learning_*.py``): exact-match checking, the held-out
split, the bootstrap, the rows' budgets and quick runs."""

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "lib"))
import bench_paths  # noqa: E402,F401 - every benchmarks/<concern>/ on sys.path
import learning_comlrl  # noqa: E402
import learning_config  # noqa: E402
import learning_coordinator  # noqa: E402
import learning_report  # noqa: E402
import learning_runs  # noqa: E402
import learning_stats  # noqa: E402
import learning_tasks  # noqa: E402
import learning_train  # noqa: E402

from comlrl_lightning.envs.base import Episode  # noqa: E402
from comlrl_lightning.envs.rewards import PASS_AT_1  # noqa: E402

LEARNING = (
    learning_tasks,
    learning_config,
    learning_train,
    learning_coordinator,
    learning_comlrl,
    learning_runs,
)


def patch_everywhere(monkeypatch, name, value):
    """``name`` set to ``value`` in every learning module that holds it (each module that imports a name
    holds its own binding, so a patch must reach the one that uses it)."""
    for module in LEARNING:
        if hasattr(module, name):
            monkeypatch.setattr(module, name, value)


def test_held_out_problems_are_never_training_problems():
    for task in learning_tasks.TASKS:
        held, train = learning_tasks.held_out_and_train(task)
        assert (
            len(held) == learning_tasks.NUM_HELD_OUT
            and len({str(r) for r in held}) == learning_tasks.NUM_HELD_OUT
        )
        assert len(train) == learning_tasks.NUM_TRAIN and not [r for r in train if r in held]


def test_exact_match_needs_every_agent_right_and_checks_the_stated_integer():
    ep = Episode(0, {"answers": [21, 12]})
    only, last = (
        learning_tasks.ExactMatchReward("pair", "only"),
        learning_tasks.ExactMatchReward("pair", "last"),
    )
    joint = [["21", "12."], ["7 × 3 = 21", "12"], ["21", "13"], ["To solve this", "3 × 4"]]
    r = only(joint, [ep] * 4, 0)
    assert r.values == [1.0, 0.5, 0.5, 0.0] and r.metrics[PASS_AT_1] == [1.0, 0.0, 0.0, 0.0]
    r = last(joint, [ep] * 4, 0)
    assert r.values == [1.0, 1.0, 0.5, 0.0] and r.metrics[PASS_AT_1] == [1.0, 1.0, 0.0, 0.0]
    split = learning_tasks.ExactMatchReward("split", "only")(
        [["30", "33"], ["30", "30"], ["thirty", "33"]], [Episode(0, {"n": 63})] * 3, 0
    )
    assert split.values == [1.0, 0.0, 0.0]


def test_bootstrap_counts_each_held_out_problem_once_however_many_seeds_score_it():
    # 200 problems of 0/1 outcomes, 30% solved, scored identically by 3 seeds: the interval of the mean must
    # have the width of 200 problems' binomial noise, sqrt(p(1-p)/200), not of 600 independent ones
    problems = [1.0 if (i * 7) % 10 < 3 else 0.0 for i in range(200)]
    lo, hi = learning_stats.hierarchical_bootstrap([problems] * 3, reps=4000)
    assert lo < 0.3 < hi
    assert (hi - lo) == pytest.approx(2 * 1.96 * math.sqrt(0.3 * 0.7 / 200), rel=0.15)
    assert learning_stats.hierarchical_bootstrap([[0.5] * 10] * 3, reps=100) == (
        0.5,
        0.5,
    )  # no variation: no width
    # seeds that disagree widen it beyond the problems' noise
    lo2, hi2 = learning_stats.hierarchical_bootstrap([[0.0] * 200, [0.3] * 200, [0.6] * 200], reps=4000)
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
    summ = learning_stats.summarize(runs)["magrpo"]
    assert summ["before"] == pytest.approx(0.4) and summ["after"] == pytest.approx(0.7)
    assert summ["gain"] == pytest.approx(0.3) and 0 < summ["gain_ci"][0] < 0.3 < summ["gain_ci"][1]
    res = {
        "task": learning_config.TASK,
        "rule": learning_tasks.TASK_RULE,
        "calibration": {2: {learning_config.TASK: 0.42}},
        "config": learning_config.CONFIG,
        "summary": {"magrpo": summ},
        "png": "x.png",
    }
    text = learning_report.render(res)
    assert "| MAGRPO | 3 | 96 | 40.0%" in text and "+30.0 pts" in text and "**excludes 0**" in text
    assert (
        "Not run in the recorded budget: IAC, MAAC, COORDINATOR, CENTRALIZED_MAGRPO, MADPO, MARLHF, MADPO_ONE_SHOT, MADPO_ITER, COMLRL_MADPO."
        in text
    )


def test_the_coordinator_task_checks_the_revisers_last_integer_and_holds_out_whole_questions():
    ep = Episode(0, {"q": "What is 7 × 3?", "answer": 21})
    joint = [["7 × 3 = 18", "7 × 3 = 21"], ["21", "The answer is 18."], ["21", "To solve this"], ["x", "21."]]
    r = learning_coordinator.RevisionExactMatch()(joint, [ep] * 4, 0)
    assert r.values == [1.0, 0.0, 0.0, 1.0] and r.metrics[PASS_AT_1] == r.values
    assert r.metrics["draft_correct"] == [0.0, 1.0, 1.0, 0.0]
    for task in learning_tasks.COORD_TASKS:
        held, train = learning_tasks.held_out_and_train(task)
        held_q, train_q = {r["q"] for r in held}, {r["q"] for r in train}
        assert len(held_q) == learning_tasks.NUM_HELD_OUT and not train_q & held_q
        for r in held[:10]:  # "What is a <op> b?"
            a, op, b = r["q"].removeprefix("What is ").rstrip("?").split()
            assert (int(a) + int(b) if op == "+" else int(a) * int(b)) == r["answer"]
    assert (
        learning_tasks.COORD_TASK in learning_tasks.COORD_TASKS
        and learning_runs.TASK_OF["coordinator"] == learning_tasks.COORD_TASK
    )


def _tiny_coordinator_runs(tmp_path, monkeypatch):
    """The harness's coordinator path, quick config, on the tiny model: the runs it appends."""
    from functools import partial

    monkeypatch.setitem(
        learning_runs.RUNNERS,
        "coordinator",
        partial(learning_coordinator.run_coordinator, model="builtin:tiny-gpt2"),
    )
    path = str(tmp_path / "runs.jsonl")
    learning_runs.run_missing(learning_config.TASK, ["coordinator"], [0, 1], learning_runs.QUICK, path)
    learning_runs.run_missing(
        learning_config.TASK, ["coordinator"], [0, 1], learning_runs.QUICK, path
    )  # recorded: nothing runs twice
    return learning_runs.recorded_runs(learning_tasks.COORD_TASK, learning_runs.QUICK, path)


def test_the_harness_runs_the_coordinator_on_its_task_counting_both_learners_samples(tmp_path, monkeypatch):
    runs = _tiny_coordinator_runs(tmp_path, monkeypatch)
    assert [(r["algorithm"], r["seed"], r["task"]) for r in runs] == [
        ("coordinator", 0, learning_tasks.COORD_TASK),
        ("coordinator", 1, learning_tasks.COORD_TASK),
    ]
    # QUICK: 2 rounds of 2 problems, K=2 drafts + 2 revisions each: 8 samples a round; evaluated before and after each
    assert [h["samples"] for h in runs[0]["history"]] == [0, 8, 16]
    assert all(len(h["solved"]) == learning_tasks.NUM_HELD_OUT for h in runs[0]["history"])
    summ = learning_stats.summarize(runs)["coordinator"]
    assert (
        summ["samples"] == 16
        and summ["n_problems"] == learning_tasks.NUM_HELD_OUT
        and summ["seeds"] == [0, 1]
    )
    res = {
        "task": learning_config.TASK,
        "rule": learning_tasks.TASK_RULE,
        "calibration": learning_runs._load_calibration(),
        "config": learning_runs.QUICK,
        "summary": {"coordinator": summ},
        "png": "x.png",
        "coordinator": {"task": learning_tasks.COORD_TASK, "schedule": learning_tasks.COORD_SCHEDULE},
    }
    text = learning_report.render(res)
    assert (
        f"| COORDINATOR (own task: `{learning_tasks.COORD_TASK}`) | 2 | 16 |" in text
        and f"own task `{learning_tasks.COORD_TASK}`" in text
    )
    assert "`revise_mul_12_last8` 0.46 (drafts alone 0.36)" in text


@pytest.mark.slow
def test_the_coordinators_quick_run_on_smollm2_starts_at_its_calibrated_held_out_success():
    r = learning_coordinator.run_coordinator(
        "coordinator", learning_tasks.COORD_TASK, 0, {**learning_runs.QUICK, "batches": 1}
    )  # ~1 min of CPU
    first = r["history"][0]["solved"]
    assert sum(first) / len(first) == pytest.approx(0.46)  # learning_calibration_coordinator.json, greedy
    assert [h["samples"] for h in r["history"]] == [0, 8]


def test_the_task_rule_picks_the_success_in_range_closest_to_0_35_and_the_earlier_of_equals():
    def measured(*xs):
        return {f"t{i}": {"success": x} for i, x in enumerate(xs)}

    assert learning_tasks.rule_pick(measured(0.78, 0.0, 0.46)) == "t2"  # the coordinator's calibration
    assert learning_tasks.rule_pick(measured(0.60, 0.0, 0.42)) == "t2"  # round 2 of the harness's
    assert learning_tasks.rule_pick(measured(0.09, 0.61, 0.0)) is None
    assert learning_tasks.rule_pick(measured(0.10, 0.2, 0.2, 0.58)) == "t1"


def test_the_centralized_row_gets_the_agents_token_budget_plus_the_tags_and_reports_parse_failures():
    module = learning_train.build_module(
        "centralized_magrpo", learning_config.TASK, learning_config.CONFIG
    )  # built, not loaded
    assert type(module).__name__ == "CentralizedMAGRPO" and module.num_agents == 1 and module.num_roles == 2
    assert module.team.sampling[0].max_new_tokens == 2 * 8 + learning_config.TAG_TOKENS == 41

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

    summ = learning_stats.summarize([run(0, [1.0, 0.5]), run(1, [1.0, 0.25])])
    assert summ["centralized_magrpo"]["parse_failure"] == [1.0, 0.375]
    assert (
        "at each evaluation: 100%, 38%." in learning_report._central(summ)
        and learning_report._central({}) == ""
    )
    assert "degenerate" in learning_report._central(
        summ
    )  # nothing solved before or after: say what the row can mean
    probe = {
        "temperature": 0.7,
        "problems": 24,
        "samples": 96,
        "failures": 95,
        "wall_s": 280.0,
        "loadavg": [[6.7], [7.1]],
    }
    assert "95 of 96 held no tagged section" in learning_report._central(summ, probe)


def test_marlhf_row_spends_magrpos_labels_on_its_pairs_then_runs_magrpos_batches_with_a_kl_penalty():
    per_batch = learning_config.CONFIG["batch_size"] * learning_config.CONFIG["k"] * 2
    budget = (
        learning_config.CONFIG["batches"] * per_batch
    )  # MAGRPO's completions, every one scored by the task reward
    assert (
        learning_config.marlhf_pair_samples()
        == learning_config.one_shot_num_problems() * 4 * 2
        == budget
        == 192
    )
    assert (
        learning_config.marlhf_rl_batches() == learning_config.CONFIG["batches"] == 12
    )  # 192 more, scored by the reward model only
    m = learning_train.build_module(
        "marlhf", learning_config.TASK, {**learning_config.CONFIG, "reward_model_dir": None}
    )  # built, not loaded
    assert m.loss.beta == learning_config.MARLHF_CONFIG["beta"] > 0 and m.uses_reference_model
    assert m.reward_config.reward_val_fraction == 0.2 and m.reward_config.log_task_reward
    assert (
        m.preference_config.pair_selection == "reward_gap"
        and m.preference_config.preference_num_candidates == 4
    )
    assert m.pair_source.preference_num_prompts == learning_config.one_shot_num_problems() == 24
    rec = learning_tasks.HeldOut(
        per_batch, learning_config.marlhf_pair_samples()
    )  # the curve's x: every completion sampled
    rec._cur = {0: 1.0}
    rec.on_validation_epoch_end(None, None)
    rec.batches = learning_config.marlhf_rl_batches()
    rec.on_validation_epoch_end(None, None)
    assert [h["samples"] for h in rec.history] == [0, 2 * budget] == [0, 384]


def test_the_pilots_fallback_takes_beta_0_1_only_when_the_gold_training_reward_fell():
    assert learning_config.pilot_beta([0.5] * 4 + [0.9] * 4 + [0.49] * 4) == 0.1  # last 4 below the first 4
    assert learning_config.pilot_beta([0.5] * 4 + [0.1] * 4 + [0.5] * 4) == 0.04  # equal windows: no fall
    assert (
        learning_config.pilot_beta([0.2, 0.3, 0.4, 0.5, 0.0, 0.0, 0.7, 0.8]) == 0.04
    )  # window means, not endpoints
    assert learning_config.pilot_beta([0.2, 0.3, 0.4, 0.5, 0.0, 0.0, 0.6, 0.6]) == 0.1
    with pytest.raises(ValueError, match="got 7 batches"):
        learning_config.pilot_beta([0.5] * 7)


def test_the_marlhf_quick_path_builds_pairs_on_the_online_rows_problems_and_records_the_gold_reward(
    tmp_path, monkeypatch
):
    patch_everywhere(monkeypatch, "SMOLLM2", "builtin:tiny-gpt2")
    patch_everywhere(monkeypatch, "ExactMatchReward", _ParityReward)
    monkeypatch.setattr(_ParityReward, "scored", [])  # its own count; the class list is restored after
    seen = []

    class Batches(learning_tasks.pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            seen.extend(dict(ep.data) for ep in batch)

    real = learning_tasks._quiet_trainer
    patch_everywhere(
        monkeypatch, "_quiet_trainer", lambda **kw: real(**{**kw, "callbacks": kw["callbacks"] + [Batches()]})
    )
    path = str(tmp_path / "runs.jsonl")
    learning_runs.run_missing(learning_config.TASK, ["marlhf"], [0], learning_runs.QUICK, path)
    (run,) = learning_runs.recorded_runs(learning_config.TASK, learning_runs.QUICK, path)
    m, problems = (
        run["marlhf"],
        learning_config.one_shot_problems(learning_config.TASK, learning_runs.QUICK, 0),
    )
    assert seen == problems  # phase 2: the online rows' problems of the seed, in their order
    k = learning_runs.QUICK["k"]
    # task-reward calls: held-out (50 each), the pair set (2 prompts x 4 candidates per call), and the gold
    # diagnostic of every phase-2 batch (2 problems x K joint actions)
    assert (
        _ParityReward.scored.count(learning_tasks.NUM_HELD_OUT) == 3
    )  # before, after batch 1, after batch 2
    assert _ParityReward.scored.count(2 * 4) == len(problems) // 2 and m["labelled_samples"] == 4 * 4 * 2
    assert _ParityReward.scored.count(2 * k) == learning_config.marlhf_rl_batches(learning_runs.QUICK) == 2
    assert len(m["train_task_reward"]) == len(m["train_learned_reward"]) == 2
    assert all((4 * g).is_integer() for g in m["train_task_reward"])  # parity means over 4 joint actions
    assert m["train_task_reward"] != m["train_learned_reward"]
    assert m["held_out_pairs"] == int(m["reward_info"]["num_pairs"] * 0.2)
    assert "val/reward_model/accuracy" in m["reward_info"]["history"][-1]
    assert [h["samples"] for h in run["history"]] == [0, 32 + 8, 32 + 16]
    summ = learning_stats.summarize([run])
    res = {
        "task": learning_config.TASK,
        "rule": learning_tasks.TASK_RULE,
        "calibration": learning_runs._load_calibration(),
        "config": learning_runs.QUICK,
    }
    text = learning_report.render({**res, "summary": summ, "png": "x.png"})
    assert "| MARLHF | 1 | 48 (32 labelled) |" in text
    assert "**MARLHF samples twice\n  MAGRPO's completions (48 vs 16); only the labels are matched**" in text
    assert (
        f"held-out pair accuracy {100 * m['reward_info']['history'][-1]['val/reward_model/accuracy']:.0f}%"
        in text
    )
    pilot = learning_train.run_one(
        "marlhf", learning_config.TASK, learning_config.PILOT_SEED, learning_runs.QUICK, held_out=False
    )  # the pilot: no held-out at all
    assert pilot["history"] == [] and _ParityReward.scored.count(learning_tasks.NUM_HELD_OUT) == 3


def test_the_section_says_held_out_pairs_reuse_training_questions():
    o = learning_tasks.question_overlap(learning_config.TASK)
    held, train = learning_tasks.held_out_and_train(learning_config.TASK)
    assert o["problems"] == len(held) == learning_tasks.NUM_HELD_OUT
    assert o["questions"] == 8 * 8  # operands 2..9 for each agent's own product
    assert o["both_seen"] == sum(
        r["q0"] in {t["q0"] for t in train} and r["q1"] in {t["q1"] for t in train} for r in held
    )
    text = learning_report._overlap(o)
    assert (
        f"{o['both_seen']} of {o['problems']} held-out problems" in text
        and learning_report._overlap(None) == ""
    )


class _ParityReward:
    """A reward the tiny model's sampled texts do not all tie on: agent 0's text length is even."""

    name = "parity"
    scored: list[int] = []  # joint actions per call, every instance's (training and held-out)

    def __init__(self, kind, check="only"):
        pass

    def __call__(self, joint_actions, episodes, turn):
        self.scored.append(len(joint_actions))
        values = [float(len(ja[0]) % 2 == 0) for ja in joint_actions]
        return learning_tasks.RewardResult(values, {PASS_AT_1: values})


def test_one_shot_madpo_spends_the_whole_budget_on_its_pair_set_before_the_first_update(
    tmp_path, monkeypatch
):
    per_batch = learning_config.CONFIG["batch_size"] * learning_config.CONFIG["k"] * 2
    assert (
        learning_config.one_shot_num_problems() == 24
        and learning_config.one_shot_samples() == 24 * 4 * 2 == 192
    )
    assert (
        learning_config.one_shot_samples() == learning_config.CONFIG["batches"] * per_batch
    )  # MAGRPO's budget, all of it up front
    dm = learning_tasks.datamodule(learning_config.TASK, 2, 1)
    dm.setup("fit")
    seen = [dict(ep.data) for b in list(dm.train_dataloader())[:12] for ep in b]
    assert (
        learning_config.one_shot_problems(learning_config.TASK, learning_config.CONFIG, 1) == seen
    )  # the online row's problems of that seed
    assert learning_config.one_shot_problems(learning_config.TASK, learning_config.CONFIG, 0) != seen
    module = learning_train.build_module(
        "madpo_one_shot", learning_config.TASK, learning_config.CONFIG
    )  # built, not loaded
    assert module.dpo.preference_mode == "one_shot" and module.preference.pair_selection == "reward_gap"
    assert module.preference.preference_num_candidates == 4
    assert module.dpo.num_train_epochs == learning_config.ONE_SHOT_CONFIG["num_train_epochs"]

    # the quick path on the tiny model: 2 x 2 problems x K=2 x 2 agents = 16 completions, then the passes
    patch_everywhere(monkeypatch, "SMOLLM2", "builtin:tiny-gpt2")
    patch_everywhere(monkeypatch, "ExactMatchReward", _ParityReward)  # the tiny model is never right: no pair
    monkeypatch.setattr(_ParityReward, "scored", [])  # its own count, whatever ran before (random order)
    monkeypatch.setitem(learning_config.ONE_SHOT_CONFIG, "num_train_epochs", 2)
    path = str(tmp_path / "runs.jsonl")
    learning_runs.run_missing(learning_config.TASK, ["madpo_one_shot"], [0], learning_runs.QUICK, path)
    (run,) = learning_runs.recorded_runs(learning_config.TASK, learning_runs.QUICK, path)
    o = run["one_shot"]
    training = [
        n for n in _ParityReward.scored if n != learning_tasks.NUM_HELD_OUT
    ]  # held-out: one call of 50 each
    assert (
        _ParityReward.scored.count(learning_tasks.NUM_HELD_OUT) == 2
    )  # before training and after the last update
    assert 2 * sum(training) == learning_config.one_shot_samples(
        learning_runs.QUICK
    )  # the pair set sampled the budget, once
    assert o["pairs"] >= 1 and o["updates"] == 2 * math.ceil(o["pairs"] / o["train_batch_size"])
    assert (
        [h["samples"] for h in run["history"]]
        == [0, learning_config.one_shot_samples(learning_runs.QUICK)]
        == [0, 16]
    )
    summ = learning_stats.summarize([run])["madpo_one_shot"]
    res = {
        "task": learning_config.TASK,
        "rule": learning_tasks.TASK_RULE,
        "calibration": learning_runs._load_calibration(),
        "config": learning_runs.QUICK,
        "summary": {"madpo_one_shot": summ},
        "png": "x.png",
    }
    text = learning_report.render(res)
    assert "| MADPO_ONE_SHOT (CoMLRL's mode) | 1 | 16 |" in text
    assert f"{o['pairs']} pairs" in text and "2 passes" in text and "one-shot gains" not in text
    both = learning_stats.summarize(
        [{**run, "algorithm": "madpo"}, run]
    )  # the same outcomes: the same interval
    text = learning_report.render({**res, "summary": both})
    gain = f"{100 * summ['gain']:+.1f} pts {learning_report._ci(summ['gain_ci'], True)}"
    assert f"one-shot gains {gain} and online\n  {gain} (1 and 1 seeds)" in text
    assert "the intervals overlap" in text


def test_iterative_minus_one_shot_draws_the_problems_once_for_both_rows():
    # both rows score the same problems: a gain that differs by exactly 0.5 on every problem, in every seed,
    # has a difference interval of width 0 (problems drawn independently per row would give it ~0.6)
    one = [[0.0, -1.0, 1.0, 0.0, 1.0, -1.0, 0.0, 1.0] * 5] * 3
    it = [[g + 0.5 for g in row] for row in one]
    d = learning_stats.gain_difference(it, one)
    assert d["difference"] == pytest.approx(0.5)
    assert d["ci"] == pytest.approx((0.5, 0.5)) and d["se"] == pytest.approx(0.0, abs=1e-12)
    # as if scored on different problems: two independent means of 40 values of variance 39/64 each
    lo, hi = d["ci_independent"]
    assert hi - lo == pytest.approx(2 * 1.96 * math.sqrt(2 * (39 / 64) / 40), rel=0.1)
    with pytest.raises(ValueError, match="score 40 and 39 problems"):
        learning_stats.difference_means(it, [row[:-1] for row in one])


def test_iterative_minus_one_shot_draws_each_rows_seeds_independently():
    # seeds gaining 0 and 1 everywhere in both rows: paired by seed (or seeds not resampled) the difference
    # would always be 0; drawn independently, each row's mean is 0, 0.5 or 1 (1/4, 1/2, 1/4), so the
    # difference is -1 and +1 with probability 1/16 each (> 2.5%): the interval is exactly [-1, +1]
    rows = [[0.0] * 30, [1.0] * 30]
    d = learning_stats.gain_difference(rows, rows)
    assert d["difference"] == 0.0 and d["ci"] == (-1.0, 1.0)
    reps = learning_stats.difference_means(rows, rows, reps=20000)
    assert float((reps == -1.0).double().mean()) == pytest.approx(1 / 16, abs=0.006)
    assert float((reps == 0.0).double().mean()) == pytest.approx(6 / 16, abs=0.01)


def test_the_iterative_row_spends_the_one_shot_budget_and_reports_its_difference():
    cfg = learning_config.CONFIG
    module = learning_train.build_module("madpo_iter", learning_config.TASK, cfg)  # built, not loaded
    k_cur = module.preference.preference_num_candidates
    k_cmp = module.comparator_config.comparator_num_candidates
    walked = learning_config.iterative_walk(cfg) * cfg["batch_size"]
    assert (
        module.rounds.num_rounds * walked * (k_cur + k_cmp) * 2 == learning_config.iterative_samples() == 192
    )
    assert (
        learning_config.iterative_samples() == learning_config.one_shot_samples()
    )  # comparator samples counted
    assert module.dpo.num_train_epochs == learning_config.ONE_SHOT_CONFIG["num_train_epochs"]
    assert module.dpo.train_batch_size == learning_config.ONE_SHOT_CONFIG["train_batch_size"]
    walked_1 = learning_config.iterative_problems(learning_config.TASK, cfg, 1)
    assert (
        walked_1 == learning_config.one_shot_problems(learning_config.TASK, cfg, 1)[:8]
    )  # the seed's first online problems
    assert walked_1 != learning_config.iterative_problems(learning_config.TASK, cfg, 0)

    def run(algorithm, seed, after):
        before = [1.0] * 20 + [0.0] * 30
        key = {"madpo_iter": "iterative", "madpo_one_shot": "one_shot"}[algorithm]
        info = {**learning_config.ONE_SHOT_CONFIG, "pairs": 70, "updates": 70}
        if key == "iterative":
            info = {**learning_config.ITERATIVE_CONFIG, "pairs_per_round": [8, 6, 7], "updates": 22}
        return {
            "algorithm": algorithm,
            key: info,
            "seed": seed,
            "wall_s": 60.0,
            "loadavg_start": [3.0],
            "loadavg_end": [4.0],
            "final_texts": [],
            "history": [{"samples": 0, "solved": before}, {"samples": 192, "solved": after}],
        }

    runs = [run("madpo_one_shot", s, [1.0] * 15 + [0.0] * 35) for s in range(3)]
    runs += [run("madpo_iter", s, [1.0] * 30 + [0.0] * 20) for s in range(3)]
    summ = learning_stats.summarize(runs)
    d = summ["madpo_iter"]["minus_one_shot"]
    assert summ["madpo_iter"]["gain"] == pytest.approx(0.2)
    assert summ["madpo_one_shot"]["gain"] == pytest.approx(-0.1)
    # identical seeds: the difference is 1 on 15 of the 50 problems, 0 elsewhere, so its interval is
    # the 50 problems' binomial noise around 0.3 (2 x 1.96 x sqrt(0.3 x 0.7 / 50) wide)
    assert d["difference"] == pytest.approx(0.3) and d["ci"][0] < 0.3 < d["ci"][1]
    assert d["ci"][1] - d["ci"][0] == pytest.approx(2 * 1.96 * math.sqrt(0.3 * 0.7 / 50), rel=0.15)
    assert (
        "minus_one_shot" not in learning_stats.summarize(runs[3:])["madpo_iter"]
    )  # no one-shot row: no difference
    res = {
        "task": learning_config.TASK,
        "rule": learning_tasks.TASK_RULE,
        "calibration": {2: {learning_config.TASK: 0.42}},
        "config": cfg,
        "summary": summ,
        "png": "x.png",
    }
    text = learning_report.render(res)
    assert "| MADPO_ITER (iterative, CoMLRL's) | 3 | 192 | 40.0%" in text
    assert f"**Iterative minus one-shot**: +30.0 pts {learning_report._ci(d['ci'], True)}" in text
    assert (
        f"as if the rows had scored different problems:\n  {learning_report._ci(d['ci_independent'], True)})."
        in text
    )
    assert "3 rounds x 8 problems x (2 + 2) x 2 agents =\n  192 completions" in text
    assert "seed 2: 8+6+7 pairs, 22 updates" in text


def test_comlrls_tokenizer_pads_with_a_token_smollm2s_chat_prompt_does_not_hold():
    # CoMLRL takes a decentralized prompt to end at its first pad token: SmolLM2's pad is its EOS, which
    # the rendered prompt holds (system and user turns), so the prompt would be cut and the completion
    # would begin inside it
    from comlrl_lightning.core.generation import render_prompt
    from comlrl_lightning.team.agents import AgentSpec, load_tokenizer

    tok = load_tokenizer(AgentSpec(model=learning_tasks.SMOLLM2))
    prompt = render_prompt(tok, ["What is 7 × 4? Reply with the number only."], [], True)
    ids = tok(prompt)["input_ids"]  # as CoMLRL tokenizes it
    assert tok.pad_token_id in ids
    ours = learning_comlrl.comlrl_tokenizer(tok)
    assert ours.pad_token_id not in ids and ours(prompt)["input_ids"] == ids
    assert ours.pad_token == "<|endoftext|>" and tok.pad_token == "<|im_end|>"  # ours is left as it was


@pytest.mark.slow
def test_comlrl_madpo_trains_comlrls_own_trainer_on_the_one_shot_rows_settings(tmp_path, monkeypatch):
    # the quick path on a tiny BPE model: CoMLRL's MADPOTrainer.train() on the module's own model objects
    patch_everywhere(monkeypatch, "SMOLLM2", "builtin:tiny-llama-gpt2tok")
    monkeypatch.setitem(learning_config.COMLRL_MADPO_CONFIG, "pad_token", "<|endoftext|>")
    module = learning_train.build_module("magrpo", learning_config.TASK, learning_config.CONFIG)
    module.configure_model()
    problems = learning_config.one_shot_problems(learning_config.TASK, learning_config.CONFIG, 0)
    ct = learning_comlrl.comlrl_madpo_trainer(module, learning_config.TASK, problems, learning_config.CONFIG)
    a = ct.args
    assert type(ct).__module__ == "comlrl.trainers.preference.madpo" and type(ct).__name__ == "MADPOTrainer"
    assert (
        (a.num_train_epochs, a.train_batch_size) == (2, 2) == tuple(learning_config.ONE_SHOT_CONFIG.values())
    )
    assert (a.preference_num_candidates, a.pair_selection, a.dpo_beta) == (4, "reward_gap", 0.1)
    assert (a.agent_learning_rate, a.temperature, a.top_p, a.top_k, a.max_new_tokens) == (
        1e-5,
        0.7,
        1.0,
        0,
        8,
    )
    assert all(x is y for x, y in zip(ct.agents, module.team.agents)) and len(ct.agents) == 2
    assert ct.train_dataset == problems and len(problems) == 24
    # the task's shared reward: the fraction of agents whose last integer is right
    p = problems[0]
    right = [f"It is {p['answers'][0]}", "no idea"]
    assert ct.reward_func([right[0]], [right[1]], batch_items=[p]) == [0.5]
    assert ct.reward_func([right[0]], [f"{p['answers'][1]}"], batch_items=[p]) == [1.0]
    # the prompt our team renders (the task's template in the chat template)
    assert ct.formatters[1](p) == module.team.render(1, _node(p))
    with pytest.raises(ValueError, match=r"COMLRL_MADPO_CONFIG\['pad_token'\]: '<nope>'"):
        monkeypatch.setitem(learning_config.COMLRL_MADPO_CONFIG, "pad_token", "<nope>")
        learning_comlrl.comlrl_madpo_trainer(module, learning_config.TASK, problems, learning_config.CONFIG)

    patch_everywhere(monkeypatch, "ExactMatchReward", _ParityReward)  # the tiny model is never right: no pair
    monkeypatch.setitem(learning_config.COMLRL_MADPO_CONFIG, "pad_token", "<|endoftext|>")
    monkeypatch.setattr(_ParityReward, "scored", [])  # its own count; the class list is restored after
    path = str(tmp_path / "runs.jsonl")
    learning_runs.run_missing(learning_config.TASK, ["comlrl_madpo"], [0], learning_runs.QUICK, path)
    (run,) = learning_runs.recorded_runs(learning_config.TASK, learning_runs.QUICK, path)
    o = run["comlrl_madpo"]
    assert (
        _ParityReward.scored.count(learning_tasks.NUM_HELD_OUT) == 2
    )  # our evaluation before and after train()
    training = [n for n in _ParityReward.scored if n != learning_tasks.NUM_HELD_OUT]
    assert len(training) == 4 * 2 and set(training) == {1}  # 4 problems x K=2, one joint action a call
    assert o["pairs"] >= 1 and o["updates"] == 2 * math.ceil(o["pairs"] / 2)
    assert (
        [h["samples"] for h in run["history"]]
        == [0, learning_config.one_shot_samples(learning_runs.QUICK)]
        == [0, 16]
    )
    summ = learning_stats.summarize(
        [
            run,
            {
                **run,
                "algorithm": "madpo_one_shot",
                "one_shot": {**learning_config.ONE_SHOT_CONFIG, "pairs": 3, "updates": 4},
            },
        ]
    )
    assert summ["comlrl_madpo"]["one_shot_minus"]["difference"] == 0.0
    res = {
        "task": learning_config.TASK,
        "rule": learning_tasks.TASK_RULE,
        "calibration": learning_runs._load_calibration(),
        "config": learning_runs.QUICK,
        "summary": summ,
        "png": "x.png",
    }
    text = learning_report.render(res)
    assert "| COMLRL_MADPO (CoMLRL 1.4.3's MADPOTrainer) | 1 | 16 |" in text
    assert f"seed 0: {o['pairs']} pairs, {o['updates']} updates" in text
    assert "ours (one-shot) gains" in text and "**Ours (one-shot) minus CoMLRL's**: +0.0 pts" in text


def _node(problem):
    from comlrl_lightning.core.records import Node

    spec = learning_tasks.TASKS[learning_config.TASK]
    return Node(None, 0, prompts=[[f.format(**problem)] for f in spec["formatters"]], completions=[[], []])
