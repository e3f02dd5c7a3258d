"""The "Cooperation" section of RESULTS.md: summaries, intervals, the text and the plot of
``cooperation.py``'s recorded runs (``benchmarks/run.py --only cooperation --write``)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import communication_pilot as CP
import cooperation as C
import cooperation_plan as P
from cooperation_contrasts import plan_text, reading, seed_level
from cooperation_main_job import is_summary
from cooperation_main_job import latest as latest_main_job
from cooperation_plan_report import plan_body
from cooperation_tables import LABEL, ROWS, diff, examples, table
from learning_report import _pct
from learning_runs import recorded_runs
from learning_stats import gain_difference, hierarchical_bootstrap

PNG = "cooperation.png"
SUPERSEDED = {
    "division": "scored with the first rule, superseded: a reply counted as the first item it names, so "
    '" chef, baker" / " baker, chef" was a split, and the trained team\'s greedy answers below do just that. '
    "The pre-registered plan re-runs division under the one-item rule (a reply naming two or more items is no choice)"
}
"""Tasks whose recorded (exploratory) runs were scored by a rule since changed, and how."""
JOINT_ROWS = ("joint",) + C.JOINT_TRAINERS
"""The rows that train both agents together on the shared reward (each compared with ``apart``)."""


def _mean(xs: Sequence[Sequence[float]]) -> float:
    return sum(map(sum, xs)) / sum(map(len, xs))


def summarize_task(runs: Sequence[dict[str, Any]], first_block: bool = True) -> dict[str, Any]:
    """Per condition: held-out success before (the untrained team, from the joint run of the same
    seed) and after, 95% two-level bootstrap intervals over seeds and problems, the gain; then each
    joint trainer minus apart (gains; joint's also over the first block's seeds, :data:`cooperation.SEEDS`,
    when a later block added seeds), joint minus cross-play, swap and shared (success after), each with
    its interval (two-level bootstrap); ``seed_level``: the same contrasts over seed means
    (:func:`cooperation_contrasts.seed_level`). ``first_block=False``: no first-block contrast (the
    plan's runs, whose seeds are all its own)."""
    by = {(r["algorithm"], r["seed"]): r for r in runs}
    out: dict[str, Any] = {}
    afters: dict[str, list[list[float]]] = {}
    gains: dict[str, list[list[float]]] = {}
    for cond in ROWS:
        rs = sorted((r for r in runs if r["algorithm"] == cond), key=lambda r: r["seed"])
        if not rs:
            continue
        base = [by.get(("joint", r["seed"]), r)["history"][0]["solved"] for r in rs]
        after = [r["history"][-1]["solved"] for r in rs]
        gain = [[a - b for a, b in zip(x, y)] for x, y in zip(after, base)]
        afters[cond], gains[cond] = after, gain
        out[cond] = {
            "seeds": [r["seed"] for r in rs],
            "n_problems": len(after[0]),
            "before": _mean(base),
            "before_ci": hierarchical_bootstrap(base),
            "after": _mean(after),
            "after_ci": hierarchical_bootstrap(after),
            "after_per_seed": [sum(a) / len(a) for a in after],
            "gain": _mean(gain),
            "gain_ci": hierarchical_bootstrap(gain),
            "curve": [[sum(h["solved"]) / len(h["solved"]) for h in r["history"]] for r in rs],
            "curve_samples": [h["samples"] for h in rs[0]["history"]],
            "labelled_per_agent": rs[0].get("labelled_per_agent"),
            "reward_calls_per_batch": rs[0].get("reward_calls_per_batch"),
            "wall_s_per_seed": [r["wall_s"] for r in rs],
            "loadavg": [min(r["loadavg_start"][0] for r in rs), max(r["loadavg_end"][0] for r in rs)],
            "final_texts": rs[0]["final_texts"],
            "problems": rs[0].get("problems", []),
        }
    out["differences"] = {}
    for row in JOINT_ROWS:
        if row in gains and "apart" in gains:
            out["differences"][f"{row}_minus_apart"] = gain_difference(gains[row], gains["apart"])
    if (
        first_block
        and "joint" in gains
        and "apart" in gains
        and not {*out["joint"]["seeds"], *out["apart"]["seeds"]} <= set(C.SEEDS)
    ):
        first = {
            c: [g for s, g in zip(out[c]["seeds"], gains[c]) if s in C.SEEDS] for c in ("joint", "apart")
        }
        out["differences"]["joint_minus_apart_first_block"] = gain_difference(first["joint"], first["apart"])
    for other in ("cross_play", "swap", "shared"):
        if "joint" in afters and other in afters:
            out["differences"][f"joint_minus_{other}"] = gain_difference(afters["joint"], afters[other])
    first = C.SEEDS if "joint_minus_apart_first_block" in out["differences"] else None
    seeds = {c: out[c]["seeds"] for c in gains}
    out["seed_level"] = seed_level(seeds, gains, afters, JOINT_ROWS, first)
    return out


def _calibration() -> dict[str, Any] | None:
    if not os.path.exists(C.CALIBRATION_FILE):
        return None
    with open(C.CALIBRATION_FILE) as fh:
        return json.load(fh)


def section(quick: bool, run: bool = False) -> dict[str, Any]:
    """Summarise every recorded run of every task under :data:`cooperation.CONFIG` (``run``: first run
    the missing ones, tasks in the calibration's order; ``quick``: a 1-batch joint+apart check of the
    coordination harness in a scratch file)."""
    cfg, path = C.CONFIG, C.RUNS_FILE
    cal = _calibration()
    order = cal["order"] if cal else list(C.TASKS)
    if quick:
        cfg = {**C.CONFIG, "batches": 1, "eval_every": 1, "k": 2, "num_held_out": 4}
        path = os.path.join(os.environ.get("TMPDIR", "/tmp"), "cooperation_quick_runs.jsonl")
        if os.path.exists(path):
            os.remove(path)
        C.run_missing("coordination", (0,), cfg, path)
        order = ["coordination"]
    elif run:
        for task in order:
            C.run_missing(task)
    runs = {t: recorded_runs(t, cfg if quick else C.config_for(t), path) for t in order}
    tasks = {t: summarize_task(rs) for t, rs in runs.items()}
    plan = P.load_plan()
    plan_runs = {t: recorded_runs(t, P.plan_config(t, plan), path) for t in plan["order"] if t in C.TASKS}
    complete = {  # no interim look: a task's runs are summarised once every run the plan lists is in
        t: summarize_task(rs, first_block=False)
        for t, rs in plan_runs.items()
        if P.recorded_count(plan, rs) == len(P.expected_rows(plan))
    }
    pilot = CP.selection(CP.recorded(), plan["communication"]["candidates"])
    not_run = (
        {"communication": "no format passed the plan's selection (the pilot below)"}
        if pilot["decided"] and pilot["kept"] is None
        else {}
    )
    return {
        "plan": plan,
        "plan_commits": P.plan_commits(),
        "plan_summary": P.summarize_plan(plan, plan_runs, not_run),
        "plan_tasks": complete,
        "pilot": pilot,
        "rule": C.TASK_RULE,
        "calibration": cal,
        "config": cfg,
        "task_config": C.TASK_CONFIG,
        "second_block": C.SECOND_BLOCK,
        "main_job": None if quick else latest_main_job(),
        "order": order,
        "first_record": {t: min(r["date"] for r in rs) for t, rs in runs.items() if rs and "date" in rs[0]},
        "tasks": tasks,
        "png": PNG,
    }


def render_task(task: str, summ: dict[str, Any], cal: dict[str, Any] | None) -> str:
    start = (
        f" (untrained greedy held-out success at calibration: {_pct(cal['tasks'][task]['success'])})"
        if cal
        else ""
    )
    d, sl = summ.get("differences", {}), summ.get("seed_level", {})
    note = [f"Exploratory runs, not pre-registered; {SUPERSEDED[task]}.", ""] if task in SUPERSEDED else []
    lines = [
        f"### {task}{start}",
        "",
        *note,
        table(summ),
        "",
        f"- joint − apart (gain): {diff(summ, 'joint_minus_apart')}",
        *(
            f"- joint − apart (gain), first block only (seeds {', '.join(map(str, C.SEEDS))}): {diff(summ, k)}"
            for k in ("joint_minus_apart_first_block",)
            if k in d
        ),
        *(
            f"- {LABEL[row]} − apart (gain): {diff(summ, f'{row}_minus_apart')}{_calls(summ, row, task)}"
            for row in C.JOINT_TRAINERS
            if f"{row}_minus_apart" in d
        ),
        f"- joint − cross-play (success after, paired by joint seed): {diff(summ, 'joint_minus_cross_play')}",
        f"- joint − swap (success after, paired by joint seed): {diff(summ, 'joint_minus_swap')}",
        f"- joint − shared model (success after): {diff(summ, 'joint_minus_shared')}",
    ]
    if sl:
        lines += ["", f"Contrasts looked at: {len(sl)}, none pre-registered: the p-values are unadjusted and "
                  f"descriptive (Holm over these {len(sl)} would multiply the smallest by {len(sl)}).",
                  "", f"Read: {reading(sl)}"]  # fmt: skip
    if "joint" in summ:
        lines += ["", f"Greedy held-out answers of the joint team, seed {summ['joint']['seeds'][0]}, after training:", "",
                  examples(summ["joint"], task)]  # fmt: skip
    if cal and task in cal["tasks"]:
        c = cal["tasks"][task]
        lines += [
            "",
            "The untrained team on the same problems:",
            "",
            examples({"final_texts": c["examples"], "problems": c["problems"]}, task),
        ]
    return "\n".join(lines)


def _calls(summ: dict[str, Any], row: str, task: str) -> str:
    """The reward calls of ``row`` per batch when they differ from joint MAGRPO's (its labelled samples)."""
    calls, base = summ[row].get("reward_calls_per_batch"), C.labelled_per_batch(task, C.config_for(task))
    if calls is None or calls == base:
        return ""
    return f"; the same samples, the reward scoring {calls} joint actions per batch (joint MAGRPO: {base})"


def _task_config(tc: dict[str, Any] | None) -> str:
    return (
        "; ".join(f"{t}: " + ", ".join(f"{k}={v}" for k, v in c.items()) for t, c in (tc or {}).items())
        or "none"
    )


def render(res: dict[str, Any]) -> str:
    cfg = res["config"]
    head = f"""Two SmolLM2-135M-Instruct agents (`builtin:smollm2-135m-instruct`, fp32, no chat template: the
prompts end in "I pick:"), CPU, one torch thread per run. Per run: {cfg["batches"]} batches of {cfg["batch_size"]}
episodes, K={cfg["k"]} samples per agent, AdamW lr {cfg["learning_rate"]}, temperature {cfg["temperature"]}, at most
{cfg["max_new_tokens"]} new tokens; per task, fixed before its first run: {_task_config(res.get("task_config"))}. Every trained agent sees the same labelled samples (joint actions the reward
scores) in every condition; trained apart, the pair spends twice the team's, which can only help it.
Held-out: {cfg["num_held_out"]} problems of categories never seen in training, greedy, one answer per agent;
success = the shared reward's pass@1 (1 when the pair's answers cooperate). **Contrasts are tested at seed
level** (`seed_stats.py`: one number per training run; independent groups: exact permutation test of seed
means, Welch's test as a check, 95% Welch t-interval, Hedges' g; cross-play and swap paired by the joint seed:
exact sign-flip test). The 95% two-level bootstrap over seeds and held-out problems (`learning_stats`: the
problems drawn once for both rows) is a secondary view: with 3-6 seeds it is too narrow. Produced by
`benchmarks/cooperation/cooperation.py` (runs), `cooperation_plan.py` (the plan's runs) and `cooperation_report.py`.

{plan_text(res["plan"], res["plan_commits"], res["plan_summary"])}
{plan_body(res)}**Exploratory blocks, before the plan.**

Task order stated before any training: {res["rule"]}
Order stated: {", ".join(res["order"])}. Order run (first record of each task): {_first(res)}.

The second block ({res["second_block"]["written"]}): {res["second_block"]["text"]}
"""
    cal = res.get("calibration")
    ran = [t for t in res["order"] if any(c in res["tasks"].get(t, {}) for c in ROWS)]
    body = [render_task(t, res["tasks"][t], cal) for t in ran]
    pending = [t for t in res["order"] if t not in ran]
    tail = (
        f"\n\nNot run yet: {', '.join(pending)} (`python benchmarks/cooperation/cooperation.py run TASK`)."
        if pending
        else ""
    )
    return (
        head
        + "\n"
        + "\n\n".join(body)
        + tail
        + f"\n\n![held-out team success per condition]({PNG})\n"
        + _main_job(res.get("main_job"))
    )


def _first(res: dict[str, Any]) -> str:
    """Tasks by their first recorded run, with its time; says whether that is the stated order."""
    first = res.get("first_record") or {}
    ran = sorted(first, key=first.get)
    text = ", ".join(f"{t} {first[t]}" for t in ran) or "none yet"
    stated = [t for t in res["order"] if t in first]
    return text + ("" if ran == stated else " (not the stated order)")


def _main_job(m: dict[str, Any] | None) -> str:
    if not m:
        return "\nThe main job (`make run`) on a clean clone: not measured yet (`benchmarks/cooperation/cooperation_main_job.py`).\n"
    lines = (
        "\n".join(f"  - `{line}`" for line in m["summary"] if is_summary(line)) or "  - (no summary printed)"
    )
    args = " ".join(m["make_args"])
    command = f"`make run {args}`" if args else "`make run` (the default config)"
    return f"""
**The main job**, {command} on a clean clone of `{m["commit"][:10]}` (`benchmarks/cooperation/cooperation_main_job.py`:
fresh venv and model cache, torch's default threads), {m["date"]}: {m["wall_s"] / 60:.1f} min wall, exit code
{m["returncode"]}, load average {m["loadavg_start"][0]:.1f} at the start and {m["loadavg_end"][0]:.1f} at the end on
{m["cores"]} cores. It printed:

{lines}
"""


def plot(res: dict[str, Any], path: str) -> None:
    """Held-out success after training per condition (bars, 95% intervals), the untrained team as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = [t for t in res["order"] if any(c in res["tasks"].get(t, {}) for c in ROWS)]
    fig, axes = plt.subplots(1, max(len(tasks), 1), figsize=(5 * max(len(tasks), 1), 4), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        s = res["tasks"][task]
        conds = [c for c in ROWS if c in s]
        means = [s[c]["after"] for c in conds]
        err = [
            [m - s[c]["after_ci"][0] for c, m in zip(conds, means)],
            [s[c]["after_ci"][1] - m for c, m in zip(conds, means)],
        ]
        ax.bar(range(len(conds)), means, yerr=err, capsize=3, color="tab:blue")
        if "joint" in s:
            ax.axhline(s["joint"]["before"], color="gray", linestyle="--", label="untrained")
            ax.legend()
        ax.set_xticks(range(len(conds)), conds, rotation=45, ha="right")
        ax.set_ylim(0, 1)
        ax.set_title(task)
        ax.set_ylabel("held-out team success")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
