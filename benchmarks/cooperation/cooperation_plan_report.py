"""The pre-registered plan's part of the Cooperation section, below the plan's own block
(:func:`cooperation_contrasts.plan_text`): each task of the plan once its runs are all recorded, then the
communication task's format selection (:mod:`communication_pilot`)."""

from __future__ import annotations

from typing import Any

import communication_pilot as CP
from cooperation_tables import LABEL, diff, examples, table


def render_plan_task(task: str, summ: dict[str, Any], res: dict[str, Any]) -> str:
    """A task of the pre-registered plan, once its runs are all recorded: the conditions' table, the
    primary contrasts (their Holm p from the plan's table), the secondary ones (paired by the joint seed,
    unadjusted, no claim and no reading), the reading of the primary ones (provisional while another task
    of the family is undecided), and the joint team's greedy answers."""
    plan, alpha = res["plan"], res["plan_summary"]["alpha"]
    sl = summ.get("seed_level", {})
    primary = [e for e in res["plan_summary"]["contrasts"] if e["task"] == task and "result" in e]
    lines = [
        f"### {task}, {plan['id']} (pre-registered; seeds {plan['seeds'][0]}-{plan['seeds'][-1]})",
        "",
        table(summ),
        "",
    ]
    family = res["plan_summary"]["contrasts"]
    pending = [e["task"] for e in family if "result" not in e and "not_run" not in e]
    provisional = (
        f" (provisional: {', '.join(sorted(set(pending)))} still enters Holm at p = 1; a Holm p can only fall "
        "when it is decided, so 'resolved' stands and 'not resolved' may change)"
        if pending
        else ""
    )
    read = []
    for e in primary:
        row, key = e["contrast"][0], f"{e['contrast'][0]}_minus_{e['contrast'][1]}"
        lines.append(f"- primary: {LABEL[row]} − apart (gain): {diff(summ, key)}; Holm p = {e['holm_p']:.4f}")
        r, (lo, hi) = e["result"], e["result"]["interval"]
        n = f"{r['n'][0]} vs {r['n'][1]} seeds"
        read.append(
            f"{row} − apart is {'+' if r['difference'] > 0 else ''}{100 * r['difference']:.1f} pts, resolved at seed level "
            f"(Holm p = {e['holm_p']:.4f} < {alpha}, {n})"
            if e["holm_p"] < alpha
            else f"{row} − apart ({100 * r['difference']:+.1f} pts) is not resolved at seed level (Holm p = "
            f"{e['holm_p']:.4f}, {n}; 95% interval [{100 * lo:+.1f}, {100 * hi:+.1f}]: not evidence of no difference)"
        )
    paired = [k for k in ("joint_minus_cross_play", "joint_minus_swap") if k in sl]
    for k in paired:
        other = k.removeprefix("joint_minus_").replace("_", "-")
        lines.append(f"- secondary: joint − {other} (success after, paired by joint seed): {diff(summ, k)}")
    lines += [
        "",
        f"Looked at: {len(primary)} primary contrasts of this task (Holm over the plan's family of "
        f"{len(res['plan_summary']['contrasts'])}), {len(paired)} secondary (unadjusted, reported without a claim).",
        "",
        f"Read: {'; '.join(read)}{provisional}. The secondary contrasts are shown without a reading, as the "
        "plan states.",
    ]
    if "joint" in summ:
        lines += ["", f"Greedy held-out answers of the joint team, seed {summ['joint']['seeds'][0]}, after training:", "",
                  examples(summ["joint"], task)]  # fmt: skip
    return "\n".join(lines)


def plan_body(res: dict[str, Any]) -> str:
    """The plan's complete tasks in its order, then the communication format selection."""
    parts = [
        render_plan_task(t, res["plan_tasks"][t], res)
        for t in res["plan"]["order"]
        if t in res.get("plan_tasks", {})
    ]
    if "pilot" in res:
        parts.append(CP.render(res["pilot"], res["plan"]))
    return "".join(part.rstrip("\n") + "\n\n" for part in parts)  # each followed by a blank line
