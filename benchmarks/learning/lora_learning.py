"""The learning row of per-agent LoRA: two LoRA adapters on one frozen SmolLM2-135M base against the
recorded full fine-tuning (``joint``) runs of the coordination task (``benchmarks/cooperation/cooperation.py``).

Same task, seeds (0, 1, 2), budget (12 batches of 2 episodes, K=4, held-out success on the same 50
problems before training and every 6 batches) and code path (``cooperation.train``) as the recorded
joint runs in ``cooperation_runs.jsonl``; one change, fixed before any run: the learning rate, 2e-4
for the adapters (``configs/coop_coordination_lora.yaml``'s; full fine-tuning's 2e-5 moves an
adapter that starts at zero ten times less). Runs go to ``lora_runs.jsonl``, one line each, and
resume from it.

    python benchmarks/learning/lora_learning.py run [SEEDS]          # the missing runs (nice, one thread)
    python benchmarks/run.py --only lora_learning --write   # the RESULTS.md row from the records
"""

from __future__ import annotations

import os
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "lib"))
import bench_paths  # noqa: E402,F401 - every benchmarks/<concern>/ on sys.path

RUNS_FILE = os.path.join(HERE, "lora_runs.jsonl")
TASK = "coordination"
LORA_LEARNING_RATE = 2e-4


def lora_config() -> dict[str, Any]:
    import cooperation as C

    return {**C.config_for(TASK), "learning_rate": LORA_LEARNING_RATE}


def run(seeds: tuple[int, ...]) -> None:
    import cooperation as C
    from learning_runs import recorded_runs

    cfg = lora_config()
    done = {r["seed"] for r in recorded_runs(TASK, cfg, RUNS_FILE) if r["algorithm"] == "lora"}
    for seed in seeds:
        if seed not in done:
            C.append(C.train("lora", TASK, seed, cfg), RUNS_FILE)


def section(quick: bool) -> dict[str, Any]:
    """LoRA and full (joint) held-out success after training, gains over the untrained team, and
    LoRA minus full (gains), 95% two-level bootstrap intervals over seeds and problems."""
    import cooperation as C
    from learning_runs import recorded_runs
    from learning_stats import gain_difference, hierarchical_bootstrap

    lora = sorted((r for r in recorded_runs(TASK, lora_config(), RUNS_FILE) if r["algorithm"] == "lora"),
                  key=lambda r: r["seed"])  # fmt: skip
    seeds = [r["seed"] for r in lora]
    full = {
        r["seed"]: r
        for r in recorded_runs(TASK, C.config_for(TASK), C.RUNS_FILE)
        if r["algorithm"] == "joint"
    }
    rows: dict[str, Any] = {}
    gains: dict[str, list[list[float]]] = {}
    for name, rs in (("lora", lora), ("full", [full[s] for s in seeds if s in full])):
        before = [r["history"][0]["solved"] for r in rs]
        after = [r["history"][-1]["solved"] for r in rs]
        gains[name] = [[a - b for a, b in zip(x, y)] for x, y in zip(after, before)]
        mean = lambda xs: sum(map(sum, xs)) / max(sum(map(len, xs)), 1)  # noqa: E731
        rows[name] = {"seeds": [r["seed"] for r in rs], "before": mean(before), "after": mean(after),
                      "after_ci": hierarchical_bootstrap(after) if rs else None, "gain": mean(gains[name]),
                      "gain_ci": hierarchical_bootstrap(gains[name]) if rs else None,
                      "after_per_seed": [sum(a) / len(a) for a in after],
                      "wall_s": [r["wall_s"] for r in rs], "loadavg": [r["loadavg_start"][0] for r in rs]}  # fmt: skip
    out: dict[str, Any] = {"task": TASK, "config": lora_config(), "rows": rows}
    if lora and len(rows["full"]["seeds"]) == len(seeds):
        out["lora_minus_full"] = gain_difference(gains["lora"], gains["full"])
    return out


def render(res: dict[str, Any]) -> str:
    from learning_report import _ci, _pct

    rows, cfg = res["rows"], res["config"]
    if not rows["lora"]["seeds"]:
        return "No LoRA run is recorded yet (`python benchmarks/learning/lora_learning.py run`)."
    lines = ["| agents | seeds | held-out success before | after [95% interval] | gain [95% interval] | per seed after |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for name, label in (("lora", f"2 LoRA adapters, one base (lr {cfg['learning_rate']:g})"),
                        ("full", "2 fully trained models (lr 2e-05; cooperation `joint`)")):  # fmt: skip
        r = rows[name]
        lines.append(f"| {label} | {r['seeds']} | {_pct(r['before'])} | {_pct(r['after'])} {_ci(r['after_ci'])} | "
                     f"{100 * r['gain']:+.1f} pts {_ci(r['gain_ci'], pts=True)} | "
                     f"{', '.join(_pct(x) for x in r['after_per_seed'])} |")  # fmt: skip
    d = res.get("lora_minus_full")
    diff = (f"LoRA gain minus full gain: {100 * d['difference']:+.1f} pts {_ci(d['ci'], pts=True)} (paired over "
            "seeds and problems)." if d else "The full side lacks some of these seeds: no difference computed.")  # fmt: skip
    walls = ", ".join(
        f"{w:.0f} s at load {lo:.1f}" for w, lo in zip(rows["lora"]["wall_s"], rows["lora"]["loadavg"])
    )
    return "\n".join(lines) + (
        f"\n\n{diff} Coordination task, {cfg['batches']} batches x {cfg['batch_size']} episodes, K={cfg['k']}, "
        f"held-out success (greedy) on {cfg['num_held_out']} problems of categories never trained on; the full "
        "side is the recorded `joint` runs of the cooperation section with the same seeds, budget and "
        f"problems; the learning rate is the one change (fixed before any run). LoRA runs: {walls}. "
        "`benchmarks/learning/lora_learning.py`."
    )


if __name__ == "__main__":
    import torch

    torch.set_num_threads(1)
    if len(sys.argv) > 1 and sys.argv[1] == "run":
        run(tuple(int(s) for s in sys.argv[2].split(",")) if len(sys.argv) > 2 else (0, 1, 2))
    else:
        print(render(section(False)))
