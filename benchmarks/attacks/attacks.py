"""Every attack of the adversarial suites, one at a time, timed: prints the markdown table of docs/attacks.md.

    python benchmarks/attacks/attacks.py > /tmp/table.md          # then paste under the table header

Reward attacks (``tests/test_adversarial_rewards.py``) run alone through ``CooperativeCodeReward``
on HumanEval/0 and are "contained" when they earn exactly what the same program earns without the
attack (the static levels 1.5, no test credit). Containment attacks are the test functions of
``tests/test_adversarial_containment.py`` (and the 200-run leftover test), "contained" when they
pass. Times are wall-clock seconds of that one attack on this machine (load printed at the end).
"""

from __future__ import annotations

import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
sys.path.insert(0, os.path.join(ROOT, "tests"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import test_adversarial_containment as cont  # noqa: E402
import test_adversarial_rewards as rew  # noqa: E402

from comlrl_lightning.coding.data import load_humaneval_rows  # noqa: E402
from comlrl_lightning.coding.reward import CooperativeCodeReward  # noqa: E402
from comlrl_lightning.envs.base import Episode  # noqa: E402


def main() -> None:
    rows = load_humaneval_rows()
    coop = CooperativeCodeReward()
    coop([[rew.TRIVIAL_AUX, rew.NON_SOLUTION]], [Episode(0, rows[0])], 0)  # records HumanEval/0 once
    print("| class | attack | outcome | reward (baseline 1.5) | seconds |")
    print("|---|---|---|---|---|")
    attacks = [("reward forging", n, rew.armed(n, c) + rew.NON_SOLUTION) for n, c in rew.FORGING.items()]
    attacks += [("reward forging", n, rew.HEAD + b) for n, b in rew.FORGING_BODIES.items()]
    attacks += [("broken completion", n, t) for n, t in rew.BROKEN.items()]
    for cls, name, main in attacks:
        t = time.perf_counter()
        value = coop([[rew.TRIVIAL_AUX, main]], [Episode(0, rows[0])], 0).values[0]
        ok = abs(value - rew.STATIC) < 1e-9 if cls == "reward forging" else 0.0 <= value <= 4.0
        print(
            f"| {cls} | `{name}` | {'contained' if ok else '**NOT CONTAINED**'} | {value:.3f} | "
            f"{time.perf_counter() - t:.2f} |"
        )
    coop.close()
    tests = [(n, f) for n, f in vars(cont).items() if n.startswith("test_")]
    tests += [
        (n, f)
        for n, f in vars(rew).items()
        if n.startswith("test_") and "fixture" not in repr(f) and f.__code__.co_argcount == 0
    ]
    for name, fn in tests:
        t = time.perf_counter()
        try:
            fn()
            outcome = "contained"
        except BaseException as err:  # noqa: BLE001 - a skip or a failure is reported, not raised
            outcome = (
                "skipped (layer missing)" if type(err).__name__ == "Skipped" else f"**FAILED** {err!r:.60}"
            )
        print(f"| containment | `{name}` | {outcome} | | {time.perf_counter() - t:.2f} |")
    print(f"\nload: {os.getloadavg()[0]:.2f} (1-min average), {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
