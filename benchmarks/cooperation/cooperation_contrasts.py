"""The cooperation section's contrasts at seed level (:mod:`seed_stats`) and their text: each training
run is one observation; the two-level bootstrap (:mod:`learning_stats`) is shown beside as a secondary
view. Also the pre-registered plan's block (:mod:`cooperation_plan`).

Contrasts of one task (:func:`seed_level`): each joint trainer - apart and joint - shared (independent
groups of seeds: exact permutation test), joint - cross-play and joint - swap (paired by the joint
seed, whose agents they reuse: exact sign-flip test over the per-seed differences).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from seed_stats import compare_independent, compare_paired

ALPHA = 0.05


def _means(rows: Sequence[Sequence[float]]) -> list[float]:
    return [sum(r) / len(r) for r in rows]


def seed_level(
    seeds: dict[str, list[int]],
    gains: dict[str, list[list[float]]],
    afters: dict[str, list[list[float]]],
    joint_rows: Sequence[str],
    first_block: Sequence[int] | None = None,
) -> dict[str, dict[str, Any]]:
    """Seed-level contrasts of one task's rows (``seeds[row]``: its seeds; ``gains`` / ``afters``: per
    seed, per held-out problem, in that seed order). ``first_block``: also joint - apart over these seeds
    alone. Two-sided; the tests' p-values are unadjusted (the caller states how many were looked at)."""
    gain = {c: dict(zip(seeds[c], _means(g))) for c, g in gains.items()}
    after = {c: dict(zip(seeds[c], _means(a))) for c, a in afters.items()}
    out: dict[str, dict[str, Any]] = {}
    for row in joint_rows:
        if row in gain and "apart" in gain:
            out[f"{row}_minus_apart"] = compare_independent(
                list(gain[row].values()), list(gain["apart"].values())
            )
    if first_block is not None and "joint" in gain and "apart" in gain:
        j, a = ([v for s, v in gain[c].items() if s in first_block] for c in ("joint", "apart"))
        out["joint_minus_apart_first_block"] = compare_independent(j, a)
    for other in ("cross_play", "swap"):  # the same joint seed's agents: paired
        if "joint" in after and other in after:
            common = sorted(set(after["joint"]) & set(after[other]))
            out[f"joint_minus_{other}"] = compare_paired(
                [after["joint"][s] - after[other][s] for s in common]
            )
    if "joint" in after and "shared" in after:  # a separate training run per seed: independent
        out["joint_minus_shared"] = compare_independent(
            list(after["joint"].values()), list(after["shared"].values())
        )
    return out


def _pts(x: float) -> str:
    return f"{100 * x:+.1f}"


def contrast_text(s: dict[str, Any] | None, boot: dict[str, Any] | None = None) -> str:
    """One contrast: difference of seed means, Hedges' g, the exact test's p, Welch's p and t-interval,
    and the two-level bootstrap interval (secondary)."""
    if s is None:
        return "not measured yet"
    paired, p = len(s["n"]) == 1, s["permutation"]
    n = f"{s['n'][0]} seeds, paired" if paired else f"{s['n'][0]} vs {s['n'][1]} seeds"
    test = ("sign-flip" if paired else "permutation") + (" (exact" if p["exact"] else " (Monte Carlo")
    g = "" if s["hedges_g"] is None else f", Hedges' g {s['hedges_g']:.2f}"
    text = f"{_pts(s['difference'])} pts ({n}{g}); {test}, {s['alternative']}, {p['relabellings']:,} relabellings) p = {p['p']:.3f}"
    if s["welch"] is not None:
        lo, hi = s["interval"]
        text += f"; {s['interval_method']} p = {s['welch']['p']:.3f}, 95% {s['interval_method']}-interval [{_pts(lo)}, {_pts(hi)}]"
    if boot is not None:
        text += f"; two-level bootstrap (secondary) [{_pts(boot['ci'][0])}, {_pts(boot['ci'][1])}]"
    return text


def reading(s: dict[str, dict[str, Any]]) -> str:
    """What the seed-level tests say, one clause each, at alpha 0.05 unadjusted (derived from them alone)."""
    out = []
    if "joint_minus_apart" in s:
        c = s["joint_minus_apart"]
        p, d = c["permutation"]["p"], c["difference"]
        out.append(
            f"at seed level the team trained together {'beats' if d > 0 else 'trails'} its agents trained apart (p = {p:.3f})"
            if p < ALPHA
            else f"joint - apart is not resolved at seed level (p = {p:.3f}, {c['n'][0]} vs {c['n'][1]} seeds)"
        )
    changed = [s[k] for k in ("joint_minus_cross_play", "joint_minus_swap") if k in s]
    if changed:
        costs = [c for c in changed if c["permutation"]["p"] < ALPHA and c["difference"] > 0]
        out.append(
            "changing the partner (cross-play or swapped roles) costs success: the convention is the pair's own"
            if costs
            else "no cost of changing the partner (cross-play, swapped roles) is resolved at seed level; "
            "that is not evidence of no cost (see the intervals)"
        )
    return "; ".join(out) + "." if out else "nothing measured yet."


def plan_text(plan: dict[str, Any], commits: dict[str, Any], summary: dict[str, Any]) -> str:
    """The pre-registered plan's block: where it is, its commit, what it fixes, and its primary family."""

    def commit(c: str) -> str:  # "<hash> (<date>)" -> "`<hash>` (<date>)"
        h, _, date = c.partition(" ")
        return f"`{h}` {date}".strip()

    added = (
        f"first committed in {commit(commits['added'])}"
        if commits["added"]
        else "**not committed** (no pre-registration)"
    )
    changed = ", ".join(map(commit, commits["changed"])) or "never"
    dirty = "; the working copy differs from its last commit" if commits["dirty"] else ""
    t = plan["test"]
    seeds = plan["seeds"]
    rows = ["| task | contrast | runs recorded | difference (seed means) | Hedges' g | 95% Welch t-interval | exact permutation p | Holm p | Welch p |",
            "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for e in summary["contrasts"]:
        head = f"| {e['task']} | {' - '.join(e['contrast'])} | {e['recorded']} of {e['needed']} |"
        r = e.get("result")
        if "not_run" in e:
            rows.append(f"{head} not run: {e['not_run']} | | | | {e['holm_p']:.3f} (p = 1: not run) | |")
            continue
        if r is None:
            rows.append(
                f"{head} not tested: the task's runs are not all recorded (no interim look) | | | | {e['holm_p']:.3f} (p = 1 until run) | |"
            )
            continue
        lo, hi = r["interval"]
        g = "n/a" if r["hedges_g"] is None else f"{r['hedges_g']:.2f}"
        rows.append(f"{head} {_pts(r['difference'])} pts | {g} | [{_pts(lo)}, {_pts(hi)}] | {r['permutation']['p']:.4f} | "
                    f"**{e['holm_p']:.4f}**{' (< alpha)' if e['holm_p'] < summary['alpha'] else ''} | {r['welch']['p']:.4f} |")  # fmt: skip
    return f"""**Pre-registered plan** (`benchmarks/cooperation/cooperation_plan.toml`, id `{plan["id"]}`): {added}; changed since: {changed}{dirty}.
Written {plan.get("written", "")}. Order: {", ".join(plan["order"])} (a task starts once the previous one is recorded).
Conditions: {", ".join(plan["conditions"])}, with apart, swap and cross-play paired by seed; seeds {seeds[0]}-{seeds[-1]}
({len(seeds)} per condition). Test: {t["primary"]}, {t["sides"]} ({t["why_two_sided"]}); alpha {t["alpha"]}; {t["multiplicity"]}.
Effect size: {t["effect_size"]}; interval: {t["interval"]}. Stopping: {plan["stopping"]["rule"]}. Communication success:
{plan["communication"]["success"]}; its format: {plan["communication"]["format"]}.

{chr(10).join(rows)}
"""
