"""Every cooperation-bonus attack of ``tests/coop_attacks.py`` on all 164 HumanEval problems.

    python benchmarks/attacks/coop_attacks.py [--tasks 0,4,29] [--every 2] [--record /tmp/coop.jsonl] > /tmp/coop.md

For each attack: on how many problems it earns more than the honest answer it imitates (the
canonical main with ``aux`` unused, or the honest wrapper, both measured on the same problem in the
same call), and for the residual classes on how many it pays at all and the most it earns over the
canonical main. Only problems where the canonical main earns the maximum without the bonus (3.0)
count. Prints a markdown table (docs/attacks.md), the wall-clock time and the load.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
sys.path.insert(0, os.path.join(ROOT, "tests"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from coop_attacks import attacks_for, helper_solves, solo_main, wrapper_main  # noqa: E402

from comlrl_lightning.coding.data import load_humaneval_rows  # noqa: E402
from comlrl_lightning.coding.reward import CooperativeCodeReward  # noqa: E402
from comlrl_lightning.envs.base import Episode  # noqa: E402

TRIVIAL = "def aux(x):\n    return x\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--tasks", default="", help="comma-separated row indices, run in that order (default: all 164)"
    )
    ap.add_argument(
        "--every",
        type=int,
        default=0,
        help="every k-th problem first, then the rest (an interrupted run leaves an even sample)",
    )
    ap.add_argument("--only", default="", help="comma-separated attack names (default: every attack)")
    ap.add_argument("--partial", default="", help="file rewritten with the table after every problem")
    ap.add_argument(
        "--record",
        default="",
        help="JSON lines, one per problem (its values by attack); problems already in it are not rerun",
    )
    args = ap.parse_args()
    rows = load_humaneval_rows()
    tasks = [int(t) for t in args.tasks.split(",") if t] or list(range(len(rows)))
    if args.every > 1:
        tasks = [t for r in range(args.every) for t in tasks[r :: args.every]]
    records = {}
    if args.record and os.path.exists(args.record):
        with open(args.record) as fh:
            records = {r["task"]: r for r in map(json.loads, fh) if r["task"] in tasks}
    coop = CooperativeCodeReward()
    load0, t0 = os.getloadavg()[0], time.perf_counter()
    names = [(a.cls, a.name, a.baseline) for a in attacks_for(rows[tasks[0]]) if _chosen(a, args.only)]
    for idx in tasks:
        if idx in records:
            continue
        row = rows[idx]
        atks = [a for a in attacks_for(row) if _chosen(a, args.only)]
        pairs = [(TRIVIAL, solo_main(row)), (helper_solves(row), wrapper_main(row, "return aux({args})"))]
        pairs += [(a.aux, a.main) for a in atks]
        try:
            values = coop([list(p) for p in pairs], [Episode(0, row) for _ in pairs], 0).values
        except Exception as err:  # noqa: BLE001 - e.g. a sandbox that could not start at a load of 30
            print(
                f"{row['task_id']} failed ({type(err).__name__}: {err}); left out",
                file=sys.stderr,
                flush=True,
            )
            continue
        records[idx] = {"task": idx, "solo": values[0], "wrapper": values[1]}
        records[idx]["attacks"] = {a.name: v for a, v in zip(atks, values[2:])}
        if args.record:
            with open(args.record, "a") as fh:
                fh.write(json.dumps(records[idx]) + "\n")
        print(f"{row['task_id']} done ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
        if args.partial:
            with open(args.partial, "w") as fh:
                fh.write(table(names, records, t0, load0) + "\n")
    coop.close()
    print(table(names, records, t0, load0))


def _chosen(attack, only: str) -> bool:
    return not only or attack.name in only.split(",")


def table(names, records, t0, load0) -> str:
    """The markdown table of the problems in ``records`` and its footer line."""
    paying, counted, gain = defaultdict(int), defaultdict(int), defaultdict(float)
    canonical_max = 0
    for rec in records.values():
        solo, wrapper = rec["solo"], rec["wrapper"]
        if abs(solo - 3.0) > 1e-9:  # the canonical main does not pass here: nothing to compare with
            continue
        canonical_max += 1
        for _, name, base in names:
            if name not in rec["attacks"]:
                continue
            counted[name] += 1
            honest = {"solo": solo, "wrapper": wrapper}.get(base, solo)
            if rec["attacks"][name] > honest + 1e-9:
                paying[name] += 1
                gain[name] = max(gain[name], rec["attacks"][name] - honest)
    out = ["| class | attack | imitates | problems where it earns more | most it earns over that |"]
    out.append("|---|---|---|---|---|")
    for cls, name, base in names:
        imitates = {"solo": "canonical main, aux unused", "wrapper": "honest wrapper"}.get(
            base, "canonical main"
        )
        out.append(
            f"| {cls} | `{name}` | {imitates} | {paying[name]} / {counted[name]} | +{gain[name]:.2f} |"
        )
    out.append(
        f"\ncanonical main (aux unused) at 3.0 on {canonical_max} / {len(records)} problems; "
        f"{time.perf_counter() - t0:.0f} s wall clock this run, load {load0:.2f} -> {os.getloadavg()[0]:.2f} "
        f"(1-min average), {os.cpu_count()} cores"
    )
    return "\n".join(out)


if __name__ == "__main__":
    main()
