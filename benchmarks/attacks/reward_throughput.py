"""Coding-reward throughput (candidates per second through the sandbox pool), two trees back to back.

    python benchmarks/attacks/reward_throughput.py                       # this tree only
    python benchmarks/attacks/reward_throughput.py --before /tmp/old     # a checkout of an older commit, then this tree

Each tree runs in its own child process (``PYTHONPATH`` puts its package first) on the same
candidates: for ``--problems`` HumanEval problems, ``--per-problem`` joint actions each (the
canonical solution with a trivial helper, a wrong solution, one calling the helper, and one that
raises), every program text made unique (a constant after the helper) so no cache can answer;
``--mix coop`` makes two of the four reach the cooperation level (and pay its extra runs). Rounds alternate A B A B; the
median round gives candidates/s and the ratio ``after / before`` is printed. The first round of
each tree also pays one-off costs (the new design's recording of each problem's calls), reported
separately as ``cold``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository

CHILD = r"""
import json, sys, time
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__module__ + repr(f)]
sys.path.insert(0, {path!r})
from comlrl_lightning.envs.base import Episode
from comlrl_lightning.coding import reward as R
rows = R.load_humaneval_rows()[: {problems}]
coop = R.CooperativeCodeReward(max_workers={workers})
def joint(row, j, salt):
    e, body = row["entry_point"], row["prompt"] + row["canonical_solution"]
    mains = [body, f"def {{e}}(*a):\n    return None\n", f"def {{e}}(*a):\n    return aux(*a)\n",
             f"def {{e}}(*a):\n    raise ValueError('x')\n"]
    helper = "def aux(x):\n    return x\n"
    if {mix!r} == "coop" and j % 4 in (1, 2):  # the helper solves: cooperation level, its extra runs
        helper = R.helper_as_aux(body) + "\n"
        mains[1] = f"def {{e}}(*a):\n    r = aux(*a)\n    return r\n"
    return [helper + f"_SALT = {{salt!r}}\n", mains[j % 4]]  # a constant: kept by every rewrite
out = []
for rnd in range({rounds}):
    jas = [joint(r, j, f"{{rnd}}-{{i}}-{{j}}") for i, r in enumerate(rows) for j in range({per})]
    eps = [Episode(0, r) for r in rows for _ in range({per})]
    t = time.perf_counter()
    res = coop(jas, eps, 0)
    assert R.__file__.startswith({path!r}), R.__file__
    out.append([len(jas), time.perf_counter() - t, sum(res.values)])
print("RESULT " + json.dumps(out))
"""


def run_tree(path: str, args: argparse.Namespace) -> list[list[float]]:
    code = CHILD.format(
        path=path,
        problems=args.problems,
        workers=args.workers,
        rounds=args.rounds,
        per=args.per_problem,
        mix=args.mix,
    )
    env = {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False, cwd=path
    )
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode or not line:
        raise SystemExit(f"{path}: benchmark child failed:\n{proc.stderr[-3000:]}")
    return json.loads(line[0][7:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", help="checkout of the older tree (run first in each pair)")
    ap.add_argument("--problems", type=int, default=12)
    ap.add_argument("--per-problem", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--pairs", type=int, default=2, help="A B repetitions (each a fresh child process)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument(
        "--mix",
        choices=("shipped", "coop"),
        default="shipped",
        help="shipped: the four candidates above; coop: two of the four reach the cooperation level "
        "(the helper is the canonical solution, main returns its result), so they pay its extra runs",
    )
    args = ap.parse_args()
    trees = ([("before", os.path.abspath(args.before))] if args.before else []) + [("after", ROOT)]
    warm: dict[str, list[float]] = {n: [] for n, _ in trees}
    cold: dict[str, list[float]] = {n: [] for n, _ in trees}
    for _ in range(args.pairs):
        for name, path in trees:
            rounds = run_tree(path, args)
            cold[name].append(rounds[0][0] / rounds[0][1])
            warm[name] += [n / s for n, s, _ in rounds[1:]]
    print(
        f"load: {os.getloadavg()[0]:.2f} (1-min average), {os.cpu_count()} cores, workers={args.workers}, "
        f"{args.problems} problems x {args.per_problem} candidates per round, mix={args.mix}"
    )
    for name, _ in trees:
        print(
            f"{name:>6}: warm {statistics.median(warm[name]):6.1f} candidates/s   "
            f"cold (first round) {statistics.median(cold[name]):6.1f} candidates/s"
        )
    if args.before:
        print(
            f"ratio after/before: warm {statistics.median(warm['after']) / statistics.median(warm['before']):.2f}"
            f"  cold {statistics.median(cold['after']) / statistics.median(cold['before']):.2f}"
        )


if __name__ == "__main__":
    t0 = time.time()
    main()
    print(f"({time.time() - t0:.0f} s)")
