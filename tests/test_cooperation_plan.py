"""The cooperation section's seed-level contrasts and its pre-registered plan (benchmarks/
cooperation_contrasts.py, cooperation_plan.py, cooperation_plan.toml): hand-counted p-values, pairing
by seed, the plan's commit, no test before a task's runs are all in, Holm over the family."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH / "lib"))
import bench_paths  # noqa: E402,F401 - every benchmarks/<concern>/ on sys.path
import cooperation as C  # noqa: E402
import cooperation_contrasts as K  # noqa: E402
import cooperation_plan as P  # noqa: E402
import cooperation_report as R  # noqa: E402


def _run(cond, seed, after, before=(0.0,) * 4):
    hist = [{"samples": 0, "solved": list(before)}, {"samples": 8, "solved": list(after)}]
    return {"algorithm": cond, "seed": seed, "history": hist, "final_texts": [], "wall_s": 1.0,
            "loadavg_start": [1.0], "loadavg_end": [1.0]}  # fmt: skip


def _solved(k, n=4):
    return [1.0] * k + [0.0] * (n - k)


def test_seed_level_contrasts_test_seed_means_and_pair_swap_by_joint_seed():
    runs = []
    for s, (j, a, sw) in enumerate([(4, 1, 3), (3, 0, 1), (2, 2, 2)]):  # solved of 4 per seed
        runs += [_run("joint", s, _solved(j)), _run("apart", s, _solved(a)), _run("swap", s, _solved(sw))]
    sl = R.summarize_task(runs)["seed_level"]
    # joint gains 1, .75, .5 vs apart .25, 0, .5: the difference is (2 x group sum - 3) / 3; of the 20
    # relabellings, |.| >= 0.5 for {1, .75, .5} and {.25, 0, .5} with either seed's .5: 4, so p = 4/20
    c = sl["joint_minus_apart"]
    assert c["n"] == (3, 3) and c["difference"] == pytest.approx(0.5) and c["permutation"]["p"] == 4 / 20
    # swap, per joint seed: 1 - .75, .75 - .25, .5 - .5 -> d = [.25, .5, 0]; the 8 sign patterns' sums are
    # +-.75 and +-.25, each twice (the 0 flips to itself): |sum| >= .75 in 4 of 8
    p = sl["joint_minus_swap"]
    assert p["n"] == (3,) and p["permutation"]["p"] == 4 / 8 and p["permutation"]["relabellings"] == 8


def test_swap_is_paired_by_seed_not_by_position():
    runs = [_run("joint", 0, _solved(4)), _run("joint", 1, _solved(0))]
    runs += [_run("swap", 1, _solved(0)), _run("swap", 0, _solved(4))]  # recorded in the other order
    d = R.summarize_task(runs)["seed_level"]["joint_minus_swap"]
    assert d["difference"] == 0.0 and d["permutation"]["p"] == 1.0


def test_the_recorded_division_runs_give_the_reviewers_seed_level_p_values():
    # issue 40, computed independently on the same seed means: Welch 0.054, permutation 0.069; IAC 0.018 / 0.024
    runs = [json.loads(line) for line in open(BENCH / "cooperation" / "cooperation_runs.jsonl")]
    sl = R.summarize_task([r for r in runs if r["task"] == "division" and r["config"] == C.CONFIG])[
        "seed_level"
    ]
    j, i = sl["joint_minus_apart"], sl["iac_minus_apart"]
    assert round(j["permutation"]["p"], 3) == 0.069 and round(j["welch"]["p"], 3) == 0.054
    assert round(i["permutation"]["p"], 3) == 0.024 and round(i["welch"]["p"], 3) == 0.018


def test_the_reading_follows_the_seed_level_tests():
    def c(p, d, n=(6, 6)):
        return {"permutation": {"p": p}, "difference": d, "n": n}

    text = K.reading({"joint_minus_apart": c(0.069, 0.24), "joint_minus_swap": c(0.75, 0.01, (6,))})
    assert text.startswith("joint - apart is not resolved at seed level (p = 0.069, 6 vs 6 seeds)")
    assert "not evidence of no cost" in text
    text = K.reading({"joint_minus_apart": c(0.01, 0.3), "joint_minus_cross_play": c(0.03, 0.2, (6,))})
    assert "trained together beats" in text and "the convention is the pair's own" in text


def test_plan_commits_finds_the_commit_that_first_added_the_file(tmp_path):
    def git(*args):
        return subprocess.run(
            ["git", "-C", str(tmp_path), *args], capture_output=True, text=True, check=True
        ).stdout

    git("init", "-q")
    git("config", "user.email", "t@t"), git("config", "user.name", "t")
    plan = tmp_path / "plan.toml"
    plan.write_text("id = 'a'\n")
    git("add", "plan.toml"), git("commit", "-qm", "plan")
    first = git("log", "-1", "--format=%h").strip()
    plan.write_text("id = 'b'\n")
    git("commit", "-qam", "amend")
    second = git("log", "-1", "--format=%h").strip()
    got = P.plan_commits(str(plan))
    assert got["added"].startswith(first + " (") and [c.split()[0] for c in got["changed"]] == [second]
    assert not got["dirty"]
    plan.write_text("id = 'c'\n")
    assert P.plan_commits(str(plan))["dirty"]
    assert P.plan_commits(str(tmp_path / "nowhere.toml"))["added"] is None
    plan.write_text("id = 'b'\n")
    (tmp_path / "moved").mkdir()
    git("mv", "plan.toml", "moved/plan.toml"), git("commit", "-qm", "move")  # a move is no change
    moved = P.plan_commits(str(tmp_path / "moved" / "plan.toml"))
    assert moved["added"] == got["added"] and moved["changed"] == got["changed"] and not moved["dirty"]
    (tmp_path / "moved" / "plan.toml").write_text("id = 'd'\n")
    git("commit", "-qam", "edit after the move")
    third = git("log", "-1", "--format=%h").strip()
    assert [c.split()[0] for c in P.plan_commits(str(tmp_path / "moved" / "plan.toml"))["changed"]] == [
        second,
        third,
    ]


def test_the_shipped_plan_is_committed_and_fixes_the_primary_family():
    plan = P.load_plan()
    assert len(plan["seeds"]) >= 10 and plan["order"][0] == "division"
    assert [(p["task"], tuple(p["contrast"])) for p in plan["primary"]] == [
        ("division", ("joint", "apart")), ("division", ("iac", "apart")), ("communication", ("joint", "apart"))]  # fmt: skip
    assert P.plan_commits()["added"] is not None
    # 4 trained conditions + apart, swap, cross-play, each over 10 seeds
    assert len(P.expected_rows(plan)) == 70


def _plan(seeds=(10, 11, 12)):
    return {"id": "t", "order": ["division"], "conditions": ["joint", "apart0", "apart1"], "seeds": list(seeds),
            "primary": [{"task": "division", "contrast": ["joint", "apart"]},
                        {"task": "division", "contrast": ["joint", "swap"]}],
            "test": {"sides": "two-sided", "alpha": 0.05}}  # fmt: skip


def test_no_primary_test_before_every_run_of_the_task_is_recorded_then_holm():
    plan = _plan()
    runs = []
    for s, (j, a) in zip(plan["seeds"], [(4, 0), (4, 1), (3, 0)]):
        runs += [_run("joint", s, _solved(j)), _run("apart", s, _solved(a)), _run("swap", s, _solved(j))]
        runs += [_run("apart0", s, _solved(a)), _run("apart1", s, _solved(a))]
    partial = P.summarize_plan(plan, {"division": runs})  # cross-play missing: an interim look is refused
    assert all("result" not in e for e in partial["contrasts"]) and partial["contrasts"][0]["recorded"] == 15
    assert [e["holm_p"] for e in partial["contrasts"]] == [1.0, 1.0]
    runs += [_run("cross_play", s, _solved(2)) for s in plan["seeds"]]
    out = P.summarize_plan(plan, {"division": runs})["contrasts"]
    # joint 1, 1, .75 vs apart 0, .25, 0: only the observed split and its mirror reach |0.833| -> 2/20;
    # joint - swap is 0 (p = 1); Holm: 2 x 0.1 = 0.2, then max(0.2, 1) = 1
    assert out[0]["result"]["permutation"]["p"] == pytest.approx(0.1) and out[0]["holm_p"] == pytest.approx(
        0.2
    )
    assert out[1]["holm_p"] == 1.0


def test_run_plan_runs_tasks_in_the_plans_order_and_refuses_one_not_built(monkeypatch):
    calls = []
    monkeypatch.setattr(
        C, "run_missing", lambda task, seeds, cfg, conditions: calls.append((task, seeds, cfg, conditions))
    )
    plan = {**_plan(), "order": ["division", "coordination", "communication"]}
    with pytest.raises(ValueError, match="plan t: task 'communication' is not built yet"):
        P.run_plan(plan)
    assert [c[0] for c in calls] == ["division", "coordination"]
    assert calls[0][1] == (10, 11, 12) and calls[0][2] == {**C.CONFIG, "plan": "t"}
    assert calls[0][3] == ("joint", "apart0", "apart1")


def test_the_section_prints_the_plan_with_its_commit(monkeypatch):
    monkeypatch.setattr(R, "recorded_runs", lambda *a, **k: [])
    monkeypatch.setattr(R, "latest_main_job", lambda: None)
    monkeypatch.setattr(
        P,
        "plan_commits",
        lambda path=P.PLAN_FILE: {"added": "abc1234 (2026-12-05)", "changed": [], "dirty": False},
    )
    text = R.render(R.section(quick=False))
    assert (
        "**Pre-registered plan** (`benchmarks/cooperation/cooperation_plan.toml`, id `plan-1`): first committed in `abc1234` (2026-12-05); changed since: never."
        in text
    )
    assert "| division | joint - apart | 0 of 70 | not tested" in text


def _pilot_run(cand, seed, last4, told=0.0):
    return {"candidate": cand, "seed": seed, "train_pass_at_1": [0.0] * 8 + list(last4), "config": {"max_new_tokens": 3},
            "message_names_secret": [told] * 12, "wall_s": 10.0, "loadavg_start": [1.0], "loadavg_end": [2.0]}  # fmt: skip


def test_the_pilot_selection_judges_candidates_in_the_plans_order():
    import communication_pilot as CP

    lines = ["a", "b", "c"]
    below = [_pilot_run(1, s, [0.25] * 4) for s in CP.PILOT_SEEDS]  # 0.25 < chance + 0.15 = 0.40
    above = [_pilot_run(2, s, [0.5, 0.5, 0.3, 0.3]) for s in CP.PILOT_SEEDS]  # 0.40: at the bar, kept
    sel = CP.selection(below + above[:2], lines)  # candidate 2 has 2 of 3 seeds: not judged yet
    assert sel["candidates"][1]["verdict"] is None and not sel["decided"] and sel["kept"] is None
    sel = CP.selection(below + above, lines)
    assert (
        sel["kept"] == 2 and sel["decided"] and sel["candidates"][1]["verdict"]["mean"] == pytest.approx(0.4)
    )
    # a later candidate kept while an earlier one is not judged yet decides nothing (the order rules)
    third = [_pilot_run(3, s, [1.0] * 4) for s in CP.PILOT_SEEDS]
    sel = CP.selection(below + above[:1] + third, lines)
    assert sel["kept"] is None and not sel["decided"] and sel["judged"] == 1
    assert (
        sel["candidates"][2]["complete"] and sel["candidates"][2]["verdict"] is None
    )  # not reached by the rule
    # a repeated seed (a concurrent --only run) and a seed outside the pilot's are not averaged in
    extra = [_pilot_run(2, 200, [1.0] * 4), _pilot_run(2, 999, [1.0] * 4)]
    sel = CP.selection(below + above + extra, lines)
    assert (
        sel["candidates"][1]["verdict"]["mean"] == pytest.approx(0.4)
        and len(sel["candidates"][1]["runs"]) == 3
    )
    none = CP.selection(
        below + [_pilot_run(c, s, [0.0] * 4, told=0.25) for c in (2, 3) for s in CP.PILOT_SEEDS], lines
    )
    assert none["decided"] and none["kept"] is None and none["candidates"][2]["message_names_secret"] == 0.25


def _plan_runs(seeds, gains):
    """Every row the shipped plan lists, per seed: success after = ``gains[row]`` of 4 problems solved."""
    runs = []
    for s in seeds:
        for row, k in gains.items():
            runs.append(_run(row, s, _solved(k)))
    return runs


def test_a_complete_plan_task_is_rendered_with_its_primary_holm_and_an_undecided_pilot_says_so(monkeypatch):
    plan = P.load_plan()
    rows = {"joint": 3, "apart0": 1, "apart1": 1, "apart": 1, "iac": 1, "swap": 3, "cross_play": 3}
    runs = _plan_runs(plan["seeds"], rows)
    for r in (
        runs
    ):  # joint beats apart on every seed by 2 of 4 problems: the most extreme split, p = 2 / C(20, 10)
        r["problems"], r["final_texts"] = [], [[], []]
    monkeypatch.setattr(
        R, "recorded_runs", lambda task, cfg, path: runs if cfg.get("plan") and task == "division" else []
    )
    monkeypatch.setattr(R, "latest_main_job", lambda: None)
    monkeypatch.setattr(R.CP, "recorded", lambda: [_pilot_run(1, s, [0.0] * 4) for s in R.CP.PILOT_SEEDS])
    res = R.section(quick=False)
    text = R.render(res)
    e = res["plan_summary"]["contrasts"]
    assert e[0]["result"]["permutation"]["p"] == pytest.approx(2 / 184756)
    # Holm over 3: joint - apart and iac - apart (0 difference, p = 1) and communication (not run yet, p = 1)
    assert e[0]["holm_p"] == pytest.approx(3 * 2 / 184756) and e[1]["holm_p"] == 1.0 and e[2]["holm_p"] == 1.0
    assert "### division, plan-1 (pre-registered; seeds 10-19)" in text
    assert (
        "joint − apart is +50.0 pts, resolved at seed level (Holm p = 0.0000 < 0.05, 10 vs 10 seeds)" in text
    )
    assert "iac − apart (+0.0 pts) is not resolved at seed level (Holm p = 1.0000" in text
    assert "(provisional: communication still enters Holm at p = 1" in text and "pair's own" not in text
    assert (
        "- secondary: joint − cross-play (success after, paired by joint seed): +0.0 pts (10 seeds, paired"
        in text
    )
    assert "Selection under way: 1 of 5 candidates judged" in text
    assert "| communication | joint - apart | 0 of 70 | not tested" in text


def test_no_format_kept_means_the_communication_contrast_is_not_run_and_the_section_says_why(monkeypatch):
    monkeypatch.setattr(R, "recorded_runs", lambda *a, **k: [])
    monkeypatch.setattr(R, "latest_main_job", lambda: None)
    pilots = [_pilot_run(c, s, [0.25] * 4, told=0.02) for c in range(1, 6) for s in R.CP.PILOT_SEEDS]
    monkeypatch.setattr(R.CP, "recorded", lambda: pilots)
    text = R.render(R.section(quick=False))
    assert (
        "| communication | joint - apart | 0 of 70 | not run: no format passed the plan's selection" in text
    )
    assert "No candidate reached the bar, so by the plan's rule the communication task was not run" in text
    assert "training pass@1 averaged 0.25 (candidates 0.25-0.25; chance 0.25, bar 0.40)" in text
    assert "(3 new tokens) named the secret in 2.0% of cases. With the secret in so few messages" in text
    assert "### division, plan-1" not in text  # division's runs are not all in: no interim summary


def test_the_pilot_reads_messages_that_named_the_secret_but_went_unused_differently():
    import communication_pilot as CP

    runs = [_pilot_run(c, s, [0.25] * 4, told=0.6) for c in (1, 2) for s in CP.PILOT_SEEDS]
    text = CP.why_not(CP.selection(runs, ["a", "b"]), 0.25)
    assert "named the secret in 60.0% of cases. The messages carried the secret often enough" in text
