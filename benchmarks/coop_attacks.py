"""Every cooperation-bonus attack of ``tests/coop_attacks.py`` on all 164 HumanEval problems.

    python benchmarks/coop_attacks.py [--tasks 0,4,29] > /tmp/coop.md

For each attack: on how many problems it earns more than the honest answer it imitates (the
canonical main with ``aux`` unused, or the honest wrapper, both measured on the same problem in the
same call), and for the residual classes on how many it pays at all and the most it earns over the
canonical main. Only problems where the canonical main earns the maximum without the bonus (3.0)
count. Prints a markdown table (docs/attacks.md), the wall-clock time and the load.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from coop_attacks import attacks_for, helper_solves, solo_main, wrapper_main  # noqa: E402

from comlrl_lightning.envs.base import Episode  # noqa: E402
from comlrl_lightning.tasks.coding.data import load_humaneval_rows  # noqa: E402
from comlrl_lightning.tasks.coding.reward import CooperativeCodeReward  # noqa: E402

TRIVIAL = "def aux(x):\n    return x\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", default="", help="comma-separated row indices (default: all 164)")
    ap.add_argument("--only", default="", help="comma-separated attack names (default: every attack)")
    ap.add_argument("--partial", default="", help="file rewritten with the table after every problem")
    args = ap.parse_args()
    rows = load_humaneval_rows()
    tasks = [int(t) for t in args.tasks.split(",") if t] or list(range(len(rows)))
    coop = CooperativeCodeReward()
    paying, counted, gain = defaultdict(int), defaultdict(int), defaultdict(float)
    canonical_max, load0, t0 = 0, os.getloadavg()[0], time.perf_counter()
    names = []
    for idx in tasks:
        row = rows[idx]
        atks = [a for a in attacks_for(row) if not args.only or a.name in args.only.split(",")]
        names = names or [(a.cls, a.name, a.baseline) for a in atks]
        pairs = [(TRIVIAL, solo_main(row)), (helper_solves(row), wrapper_main(row, "return aux({args})"))]
        pairs += [(a.aux, a.main) for a in atks]
        values = coop([list(p) for p in pairs], [Episode(0, row) for _ in pairs], 0).values
        solo, wrapper = values[0], values[1]
        canonical_max += abs(solo - 3.0) < 1e-9
        if abs(solo - 3.0) > 1e-9:  # the canonical main does not pass here (counted above)
            continue
        for a, v in zip(atks, values[2:]):
            key = (a.cls, a.name)
            counted[key] += 1
            honest = {"solo": solo, "wrapper": wrapper}.get(a.baseline, solo)
            if v > honest + 1e-9:
                paying[key] += 1
                gain[key] = max(gain[key], v - honest)
        print(f"{row['task_id']} done ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
        if args.partial:
            with open(args.partial, "w") as fh:
                fh.write(table(names, paying, counted, gain, canonical_max, idx + 1, t0, load0) + "\n")
    coop.close()
    print(table(names, paying, counted, gain, canonical_max, len(tasks), t0, load0))


def table(names, paying, counted, gain, canonical_max, done, t0, load0) -> str:
    """The markdown table and its footer line (``done`` problems so far)."""
    out = ["| class | attack | imitates | problems where it earns more | most it earns over that |"]
    out.append("|---|---|---|---|---|")
    for cls, name, base in names:
        key = (cls, name)
        imitates = {"solo": "canonical main, aux unused", "wrapper": "honest wrapper"}.get(
            base, "canonical main"
        )
        out.append(f"| {cls} | `{name}` | {imitates} | {paying[key]} / {counted[key]} | +{gain[key]:.2f} |")
    out.append(
        f"\ncanonical main (aux unused) at 3.0 on {canonical_max} / {done} problems; "
        f"{time.perf_counter() - t0:.0f} s wall clock, load {load0:.2f} -> {os.getloadavg()[0]:.2f} "
        f"(1-min average), {os.cpu_count()} cores"
    )
    return "\n".join(out)


if __name__ == "__main__":
    main()
