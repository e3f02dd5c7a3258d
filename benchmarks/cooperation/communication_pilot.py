"""Choosing the communication task's format on training problems only (``cooperation_plan.toml``,
``[communication]``): pilot runs of joint MAGRPO for each candidate, in the plan's order.

    python benchmarks/cooperation/communication_pilot.py            # every candidate not yet recorded, in order
    python benchmarks/cooperation/communication_pilot.py --only 2   # one candidate (1-based, the plan's numbering)

Each candidate is the dependence task as shipped (2 turns, 4 options, K = 2, 12 batches of 2 episodes,
the shipped prompts, no chat template) with the one change its line in the plan names. A pilot run trains
on training problems and is never evaluated on held-out problems: what it records is the training pass@1
of every batch (the share of the batch's turn-1 joint actions in which agent 1 names the secret, sampled
at temperature 1.0), read from the reward itself. The plan's selection rule: a candidate is kept when its
training pass@1 over the last 4 batches, averaged over the pilot seeds, is at least chance + 0.15; the
first kept candidate wins. Records go to :data:`PILOT_FILE`, one JSON line per run, appended as each ends.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "lib"))
import bench_paths  # noqa: E402,F401 - every benchmarks/<concern>/ on sys.path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import cooperation as C  # noqa: E402
from cooperation_plan import load_plan  # noqa: E402

PILOT_FILE = os.path.join(HERE, "communication_pilot.jsonl")
"""One JSON line per pilot run: candidate, seed, per-batch training pass@1 and message metrics."""
ONE_WORD = (
    "The secret is {secret}. Your partner must find it among these {category}: {view0}.\nMy one-word message:",
    "Your partner knows which of these {category} is the secret: {view1}. Wait for their message.\nOK:",
)
"""Candidate 2's turn-0 prompts: agent 0's asks for one word; agent 1's is the shipped one."""
CANDIDATES: list[dict[str, Any]] = [
    {"k": 4},
    {"formatters": ONE_WORD},
    {"curriculum": [2, 4]},  # options per problem in the first and the second half of the batches
    {"chat_template": True},
    {"batches": 24},
]
"""The changes the plan's ``candidates`` name, in its order (checked against its text in :func:`main`)."""
PILOT_SEEDS = (200, 201, 202)
"""The plan's ``selection``: pilot seeds 200-202."""
KEEP_MARGIN = 0.15
LAST_BATCHES = 4


class PassRecorder:
    """Wraps a dependence reward: per turn-1 call (one per training batch), the mean value and whether
    agent 0's messages named the secret (the reward's ``message_names_secret`` at turn 0)."""

    def __init__(self, reward: Any) -> None:
        self.reward, self.name = reward, reward.name
        self.turn1: list[float] = []
        self.told: list[float] = []

    def __call__(self, joint_actions: Any, episodes: Any, turn: int) -> Any:
        out = self.reward(joint_actions, episodes, turn)
        if turn == 1:
            self.turn1.append(sum(out.values) / len(out.values))
        else:
            told = out.metrics["message_names_secret"]
            self.told.append(sum(told) / len(told))
        return out


def pilot_config(candidate: dict[str, Any]) -> dict[str, Any]:
    """The cooperation CONFIG of the dependence task as shipped, with the candidate's K and batches."""
    cfg = C.config_for("dependence")
    return {**cfg, **{k: v for k, v in candidate.items() if k in ("k", "batches")}}


def pilot(index: int, seed: int) -> dict[str, Any]:
    """One pilot run of candidate ``index`` (0-based) with ``seed``; training problems only."""
    from dataclasses import replace

    import lightning.pytorch as pl

    from comlrl_lightning.datamodules import CooperationDataModule
    from comlrl_lightning.tasks.cooperation import TASKS

    cand = CANDIDATES[index]
    cfg = pilot_config(cand)
    pl.seed_everything(seed, workers=True, verbose=False)
    module = C.build("joint", "dependence", cfg, chat_template=bool(cand.get("chat_template", False)))
    stages = cand.get("curriculum", [4])
    per_stage = [cfg["batches"] // len(stages)] * len(stages)
    per_stage[-1] += cfg["batches"] - sum(per_stage)
    shipped, recorders = TASKS["dependence"], []
    t0, load0 = time.time(), os.getloadavg()
    try:
        for options, batches in zip(stages, per_stage):
            rec = PassRecorder(shipped.reward())
            recorders.append(rec)
            TASKS["dependence"] = replace(shipped, reward=lambda rec=rec: rec)
            dm = CooperationDataModule(
                task="dependence",
                num_options=options,
                formatters=cand.get("formatters"),
                batch_size=cfg["batch_size"],
                val_batch_size=1,
                num_held_out=1,
                seed=seed,
            )
            # Lightning counts every optimizer step, from 0 in each new Trainer (a cumulative count here
            # trained a curriculum's second stage for all 12 batches: 18 in all)
            steps = batches * module.steps_per_batch
            trainer = C._quiet_trainer(max_steps=steps, limit_val_batches=0, num_sanity_val_steps=0)
            trainer.fit(module, datamodule=dm)  # a curriculum's second stage: a new fit, fresh AdamW state
    finally:
        TASKS["dependence"] = shipped
    passed = [v for r in recorders for v in r.turn1]
    if len(passed) != cfg["batches"]:
        raise RuntimeError(
            f"pilot: {len(passed)} training batches recorded, the candidate has {cfg['batches']}"
        )
    return {
        "candidate": index + 1,
        "change": dict(cand),
        "seed": seed,
        "config": cfg,
        "train_pass_at_1": passed,
        "message_names_secret": [v for r in recorders for v in r.told],
        "wall_s": time.time() - t0,
        "loadavg_start": load0,
        "loadavg_end": os.getloadavg(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }


def recorded(path: str = PILOT_FILE) -> list[dict[str, Any]]:
    if not os.path.exists(path):
        return []
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def verdict(runs: list[dict[str, Any]], num_options: int = 4) -> dict[str, Any]:
    """The plan's rule on one candidate's pilot runs: mean over seeds of the last batches' pass@1."""
    last = [sum(r["train_pass_at_1"][-LAST_BATCHES:]) / LAST_BATCHES for r in runs]
    mean = sum(last) / len(last)
    need = 1 / num_options + KEEP_MARGIN
    return {"per_seed": last, "mean": mean, "need": need, "kept": mean >= need}


def selection(records: list[dict[str, Any]], candidates: list[str]) -> dict[str, Any]:
    """The plan's selection over the recorded pilot runs: one run per pilot seed (the first recorded;
    other seeds are ignored), candidates judged in the plan's order, each once all :data:`PILOT_SEEDS` are
    in and every earlier one was judged and not kept; the first kept one wins, and the selection is
    decided when one is kept or every candidate was judged and none was.

    Returns:
        ``{"candidates": [{"number", "line", "runs" (one per pilot seed recorded), "complete",
        "verdict" (:func:`verdict`, only for a judged candidate, else None), "message_names_secret" (mean
        over its runs' batches)}], "kept": number or None, "judged": how many, "decided": bool}``.
    """
    out, kept, judged = [], None, 0
    for i, line in enumerate(candidates):
        first: dict[int, dict[str, Any]] = {}
        for r in records:
            if r["candidate"] == i + 1 and r["seed"] in PILOT_SEEDS:
                first.setdefault(r["seed"], r)
        runs = [first[s] for s in sorted(first)]
        complete = len(runs) == len(PILOT_SEEDS)
        told = [v for r in runs for v in r["message_names_secret"]]
        v = None
        if kept is None and complete and judged == i:  # the rule reaches this candidate
            v, judged = verdict(runs), judged + 1
            kept = i + 1 if v["kept"] else None
        out.append({"number": i + 1, "line": line, "runs": runs, "complete": complete, "verdict": v,
                    "message_names_secret": sum(told) / len(told) if told else None})  # fmt: skip
    return {"candidates": out, "kept": kept, "judged": judged,
            "decided": kept is not None or judged == len(candidates)}  # fmt: skip


def why_not(pilot: dict[str, Any], chance: float) -> str:
    """What the judged candidates' records show, for a selection that kept none: agent 1's training
    pass@1 against chance, how often agent 0's messages named the secret, the message budget; the reading
    follows from those numbers (a rare secret in the messages, or messages that named it but went unused)."""
    judged = [c for c in pilot["candidates"] if c["verdict"]]
    means = [c["verdict"]["mean"] for c in judged]
    told = [v for c in judged for r in c["runs"] for v in r["message_names_secret"]]
    told_rate = sum(told) / len(told)
    budgets = sorted({r["config"]["max_new_tokens"] for c in judged for r in c["runs"]})
    text = (
        f"Over the {len(judged)} candidates agent 1's last-{LAST_BATCHES}-batch training pass@1 averaged "
        f"{sum(means) / len(means):.2f} (candidates {min(means):.2f}-{max(means):.2f}; chance {chance:.2f}, bar "
        f"{chance + KEEP_MARGIN:.2f}), and agent 0's sampled turn-0 messages ({', '.join(map(str, budgets))} new "
        f"tokens) named the secret in {100 * told_rate:.1f}% of cases."
    )
    if told_rate < RARE_MESSAGE:
        text += (
            " With the secret in so few messages agent 1's answer can seldom depend on agent 0's, and since the "
            "shared reward pays agent 0 only through agent 1's answer, a message naming the secret is seldom "
            "sampled and seldom reinforced: the team does not find the channel (exploration), whatever the "
            "candidates changed."
        )
    else:
        text += " The messages carried the secret often enough; agent 1 did not learn to act on them."
    return text


DEVIATIONS = (
    "candidate 3's first seed-200 run trained 18 batches, not 12 (the pilot counted the curriculum's optimizer "
    "steps across stages; fixed in f7b4cb8): that record was discarded and the seed rerun under the "
    "candidate's configuration",
    "the pilot ran beside division's confirmatory runs, not after them: it trains on communication training "
    "problems only and reads no division run; the plan's order binds confirmatory runs, and communication has none",
)
"""What the pilot did otherwise than the plan says, printed under its table."""
RARE_MESSAGE = 0.10
"""Below this share of messages naming the secret, the section reads the failure as exploration."""


def render(pilot: dict[str, Any], plan: dict[str, Any]) -> str:
    """The communication task's format selection (``communication_pilot.py``): per candidate of the plan,
    its pilot seeds' training pass@1 over the last batches against the plan's bar (for the candidates the
    rule judged), and how often agent 0's sampled messages named the secret; then what the rule decided."""
    chance = 1 / 4
    rows = [
        f"| candidate (the plan's line) | pilot seeds | training pass@1, last {LAST_BATCHES} batches, per seed | mean | kept (bar {chance + KEEP_MARGIN:.2f}) | agent 0's messages naming the secret | wall per run (load) |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in pilot["candidates"]:
        runs, v = c["runs"], c["verdict"]
        if not runs:
            rows.append(f"| {c['number']}. {c['line']} | 0 | not run | | | | |")
            continue
        if v:
            per, mean, kept = (
                ", ".join(f"{x:.2f}" for x in v["per_seed"]),
                f"{v['mean']:.2f}",
                "yes" if v["kept"] else "no",
            )
        else:
            per = (
                "complete, not judged by the rule"
                if c["complete"]
                else f"{len(runs)} of {len(PILOT_SEEDS)} seeds in"
            )
            mean = kept = ""
        told = f"{100 * c['message_names_secret']:.1f}%"
        wall = sum(r["wall_s"] for r in runs) / len(runs)
        load = (min(r["loadavg_start"][0] for r in runs), max(r["loadavg_end"][0] for r in runs))
        rows.append(f"| {c['number']}. {c['line']} | {len(runs)} | {per} | {mean} | {kept} | {told} | {wall:.0f} s ({load[0]:.1f}-{load[1]:.1f}) |")  # fmt: skip
    if pilot["kept"] is not None:
        verdict = f"Candidate {pilot['kept']} is kept (the first in the plan's order to reach the bar); its confirmatory runs follow the plan."
    elif pilot["decided"]:
        verdict = (
            "No candidate reached the bar, so by the plan's rule the communication task was not run and its primary "
            f"contrast enters Holm with p = 1. {why_not(pilot, chance)} Another format (a longer message budget, "
            "say) would be a new plan, committed before its runs."
        )
    else:
        verdict = f"Selection under way: {pilot['judged']} of {len(pilot['candidates'])} candidates judged by the rule; no held-out run yet."
    return f"""### communication, {plan["id"]}: choosing the format on training problems

The dependence task as shipped (2 turns, 4 options, K = 2, 12 batches) with one change per candidate,
joint MAGRPO, pilot seeds {", ".join(map(str, PILOT_SEEDS))}, training problems only (no held-out evaluation);
training pass@1 = the share of a batch's sampled turn-1 joint actions in which agent 1 names the secret
(`benchmarks/cooperation/communication_pilot.py`, records in `communication_pilot.jsonl`). Rule (the plan's `selection`):
{plan["communication"]["selection"]}.

{chr(10).join(rows)}

{verdict}

Deviations: {"; ".join(DEVIATIONS)}.
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--only", type=int, default=0, help="one candidate, 1-based (default: in order until one is kept)"
    )
    args = ap.parse_args()
    plan = load_plan()
    seeds = PILOT_SEEDS
    assert len(CANDIDATES) == len(plan["communication"]["candidates"]), "CANDIDATES out of step with the plan"
    import torch

    torch.set_num_threads(1)  # one thread per run, as every cooperation run
    order = [args.only - 1] if args.only else range(len(CANDIDATES))
    for i in order:
        have = {r["seed"] for r in recorded() if r["candidate"] == i + 1}
        for seed in seeds:
            if seed not in have:
                rec = pilot(i, seed)
                with open(PILOT_FILE, "a") as fh:
                    fh.write(json.dumps(rec) + "\n")
                print(
                    f"[pilot] candidate {i + 1} seed {seed}: {rec['train_pass_at_1']} in {rec['wall_s']:.0f} s",
                    flush=True,
                )
        v = verdict([r for r in recorded() if r["candidate"] == i + 1])
        print(f"[pilot] candidate {i + 1} ({plan['communication']['candidates'][i]}): {v}", flush=True)
        if v["kept"] and not args.only:
            break


if __name__ == "__main__":
    main()
