"""benchmarks/cooperation/cooperation.py and cooperation_report.py: who is paired with whom, the task order rule,
and the joint − apart / cross-play differences computed from per-problem records."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "lib"))
import bench_paths  # noqa: E402,F401 - every benchmarks/<concern>/ on sys.path
import cooperation as C  # noqa: E402
import cooperation_report as R  # noqa: E402


def test_pairings_take_each_agent_from_the_right_run():
    p = C.pairings((0, 1, 2))
    assert p["apart", 1] == [("apart0", 1, 0), ("apart1", 1, 1)]  # each agent from its own apart run
    assert p["swap", 0] == [("joint", 0, 1), ("joint", 0, 0)]  # roles swapped
    assert p["cross_play", 2] == [("joint", 2, 0), ("joint", 0, 1)]  # agent 1 of another seed
    assert ("cross_play", 0) not in C.pairings((0,))


def test_rule_order_runs_tasks_in_range_closest_to_035_first():
    order = C.rule_order({"coordination": 0.30, "division": 0.0, "dependence": 0.5})
    assert order == ["coordination", "dependence", "division"]


def test_labelled_samples_count_both_turns_of_the_dependence_task():
    assert C.labelled_per_batch("coordination", C.CONFIG) == 2 * 4
    assert C.labelled_per_batch("dependence", C.CONFIG) == 2 * (4 + 16)
    assert C.labelled_per_batch("dependence", C.config_for("dependence")) == 2 * (2 + 4)


def _run(cond, seed, before, after):
    return {"algorithm": cond, "seed": seed, "history": [{"samples": 0, "solved": before}, {"samples": 8, "solved": after}],
            "final_texts": [], "wall_s": 1.0, "loadavg_start": [1.0], "loadavg_end": [1.0]}  # fmt: skip


def test_joint_minus_apart_uses_the_untrained_team_of_the_same_seed_as_before():
    untrained = [0.0] * 10
    runs = []
    for s in (0, 1, 2):
        runs.append(_run("joint", s, untrained, [1.0] * 8 + [0.0] * 2))
        # a pairing records one evaluation only: its "before" must come from the joint run
        runs.append(
            {
                **_run("apart", s, [0.0] * 10, [1.0] * 2 + [0.0] * 8),
                "history": [{"samples": 0, "solved": [1.0] * 2 + [0.0] * 8}],
            }
        )
    out = R.summarize_task(runs)
    assert out["apart"]["before"] == 0.0 and abs(out["apart"]["gain"] - 0.2) < 1e-9
    d = out["differences"]["joint_minus_apart"]
    assert abs(d["difference"] - 0.6) < 1e-9 and d["ci"][0] > 0


def test_a_process_with_some_conditions_records_only_its_own_pairings(tmp_path, monkeypatch):
    made = []
    monkeypatch.setattr(C, "SCRATCH", str(tmp_path))

    def fake_train(condition, task, seed, cfg):
        for i in (0, 1):
            path = C.weights_path(task, condition, seed, i)
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text("w")
        made.append((condition, seed))
        return {
            "algorithm": condition,
            "task": task,
            "seed": seed,
            "config": cfg,
            "history": [{"solved": [1.0]}],
            "wall_s": 0,
        }

    def fake_pair(name, task, seed, sources, cfg):
        made.append((name, seed))
        return {
            "algorithm": name,
            "task": task,
            "seed": seed,
            "config": cfg,
            "history": [{"solved": [1.0]}],
            "wall_s": 0,
        }

    monkeypatch.setattr(C, "train", fake_train)
    monkeypatch.setattr(C, "pair", fake_pair)
    path = str(tmp_path / "runs.jsonl")
    C.run_missing("coordination", (0, 1), path=path, conditions=("apart0", "apart1"))
    assert made == [("apart0", 0), ("apart0", 1), ("apart1", 0), ("apart", 0), ("apart1", 1), ("apart", 1)]
    assert (tmp_path / "coordination").exists()  # joint's pairings are not recorded yet: weights kept
    made.clear()
    C.run_missing("coordination", (0, 1), path=path, conditions=("joint",))
    assert made == [
        ("joint", 0),
        ("swap", 0),
        ("joint", 1),
        ("cross_play", 0),
        ("swap", 1),
        ("cross_play", 1),
    ]
    C.run_missing(
        "coordination", (0, 1), path=path, conditions=("apart0", "apart1")
    )  # all recorded: weights go
    assert not (tmp_path / "coordination").exists()


def test_joint_trainer_rows_are_compared_with_apart_and_the_first_block_kept_beside_more_seeds():
    untrained, runs = [0.0] * 10, []
    for s in (0, 1, 2, 3):  # seed 3: a later block of joint and apart, where apart gained nothing
        runs.append(_run("joint", s, untrained, [1.0] * 6 + [0.0] * 4))
        apart = [1.0] * 2 + [0.0] * 8 if s < 3 else [0.0] * 10
        runs.append({**_run("apart", s, [], []), "history": [{"samples": 0, "solved": apart}]})
    for s in (0, 1, 2):
        runs.append(_run("iac", s, untrained, [1.0] * 3 + [0.0] * 7))
    d = R.summarize_task(runs)["differences"]
    assert abs(d["iac_minus_apart"]["difference"] - (0.3 - 0.15)) < 1e-9
    assert abs(d["joint_minus_apart"]["difference"] - (0.6 - 0.15)) < 1e-9  # all four seeds
    assert abs(d["joint_minus_apart_first_block"]["difference"] - (0.6 - 0.2)) < 1e-9  # seeds 0-2 only
    assert (
        "joint_minus_apart_first_block"
        not in R.summarize_task([r for r in runs if r["seed"] < 3])["differences"]
    )


def test_the_reward_calls_note_appears_only_where_they_differ_from_magrpos():
    summ = {"credit": {"reward_calls_per_batch": 32}, "iac": {"reward_calls_per_batch": 8}}
    assert "32 joint actions per batch (joint MAGRPO: 8)" in R._calls(summ, "credit", "division")
    assert R._calls(summ, "iac", "division") == ""


def test_joint_trainer_conditions_build_the_named_trainer_and_refuse_what_they_cannot_run():
    import pytest

    from comlrl_lightning import IAC, MADPO, MAGRPO

    assert type(C.build("iac", "division", C.CONFIG)) is IAC
    assert type(C.build("madpo", "division", C.CONFIG)) is MADPO
    credit = C.build("credit", "division", C.CONFIG)
    assert type(credit) is MAGRPO and credit.rollout_config.credit == "counterfactual"
    assert C.build("joint", "division", C.CONFIG).rollout_config.credit == "shared"
    with pytest.raises(ValueError, match="madpo: one-turn tasks only"):
        C.build("madpo", "dependence", C.config_for("dependence"))
    with pytest.raises(ValueError, match=r"conditions: \['ippo'\]"):
        C.run_missing("division", (0,), conditions=("ippo",))


def test_the_second_block_runs_what_it_declares(monkeypatch):
    calls = []
    monkeypatch.setattr(
        C, "run_missing", lambda task, seeds, conditions: calls.append((task, tuple(seeds), conditions))
    )
    C.run_second_block()
    assert calls == [
        ("division", (3, 4, 5), ("joint", "apart0", "apart1")),
        ("division", (0, 1, 2), ("iac", "madpo", "credit")),
        ("dependence", (0, 1, 2), ("shared",)),
    ]


def test_the_section_shows_the_latest_main_job_record(monkeypatch):
    rec = {"commit": "abcdef1234567", "make_args": [], "wall_s": 409, "loadavg_start": [0.2], "loadavg_end": [1.3],
           "cores": 2, "returncode": 0, "date": "2026-12-03 10:08",
           "summary": ["held-out team success: 0.300 -> 0.660; gain +0.360", "Epoch 0/0 ━━ 24/200"]}  # fmt: skip
    monkeypatch.setattr(R, "latest_main_job", lambda: rec)
    monkeypatch.setattr(R, "recorded_runs", lambda *a, **k: [])
    text = R.render(R.section(quick=False))
    assert "clean clone of `abcdef1234`" in text and "6.8 min wall" in text
    assert "`held-out team success: 0.300 -> 0.660; gain +0.360`" in text and "Epoch" not in text
