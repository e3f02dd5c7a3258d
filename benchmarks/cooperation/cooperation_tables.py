"""The Cooperation section's shared pieces (:mod:`cooperation_report` for the exploratory blocks,
:mod:`cooperation_plan_report` for the pre-registered plan): row names and labels, the per-condition table,
one contrast's line, the greedy answers."""

from __future__ import annotations

from typing import Any

from cooperation_contrasts import contrast_text
from learning_report import _ci, _pct

ROWS = ("joint", "iac", "madpo", "credit", "shared", "apart", "apart0", "apart1", "cross_play", "swap")
LABEL = {
    "joint": "joint MAGRPO",
    "iac": "joint IAC (a value head per agent)",
    "madpo": "joint MADPO (online pairs)",
    "credit": "joint MAGRPO, counterfactual credit",
    "shared": "one shared model (both roles)",
    "apart": "trained apart, then paired",
    "apart0": "agent 0 trained vs the frozen untrained agent 1",
    "apart1": "agent 1 trained vs the frozen untrained agent 0",
    "cross_play": "cross-play: joint agent 0 of seed s + agent 1 of seed s+1",
    "swap": "swap: joint seed s, roles swapped",
}


def diff(summ: dict[str, Any], key: str) -> str:
    """One contrast at seed level with its two-level bootstrap interval beside (secondary)."""
    return contrast_text(summ.get("seed_level", {}).get(key), summ.get("differences", {}).get(key))


def examples(s: dict[str, Any], task: str) -> str:
    texts, probs = s["final_texts"], s["problems"]
    if not texts or not probs:
        return ""
    lines = []
    for j, p in enumerate(probs[: len(texts[0])]):
        view = p.get("view0", "")
        extra = f", secret {p['secret']}" if "secret" in p else ""
        lines.append(f"| {p['category']}: {view}{extra} | `{texts[0][j]!r}` | `{texts[1][j]!r}` |")
    who = ("agent 0's message", "agent 1's answer") if task == "dependence" else ("agent 0", "agent 1")
    return f"| problem (agent 0's view) | {who[0]} | {who[1]} |\n|---|---|---|\n" + "\n".join(lines)


def table(summ: dict[str, Any]) -> str:
    """One row per condition: seeds, held-out success before / after, gain, per seed, wall per run."""
    rows = [
        "| condition | seeds | held-out before | after | gain | per seed after | wall per run (load) |",
        "|---|---|---|---|---|---|---|",
    ]
    for cond in ROWS:
        if cond not in summ:
            continue
        s = summ[cond]
        wall = f"{sum(s['wall_s_per_seed']) / len(s['wall_s_per_seed']):.0f} s ({s['loadavg'][0]:.1f}-{s['loadavg'][1]:.1f})"
        per_seed = ", ".join(_pct(a) for a in s["after_per_seed"])
        rows.append(
            f"| {LABEL[cond]} | {len(s['seeds'])} | {_pct(s['before'])} | {_pct(s['after'])} {_ci(s['after_ci'])} | "
            f"{100 * s['gain']:+.1f} pts {_ci(s['gain_ci'], True)} | {per_seed} | {wall} |"
        )
    return "\n".join(rows)
