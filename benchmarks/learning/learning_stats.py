"""The learning benchmark's statistics: two-level (seed, problem) bootstrap intervals of held-out
success and gain, the difference of two rows' gains, the per-algorithm summary and its plot.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from learning_tasks import NUM_HELD_OUT


def bootstrap_means(per_seed: Sequence[Sequence[float]], reps: int = 10000, seed: int = 0) -> torch.Tensor:
    """``[reps]`` two-level bootstrap means over seeds and held-out problems (``per_seed``: one list
    of per-problem values per seed, the same problems in the same order in every seed).

    Each replicate draws the problems with replacement once and applies that draw to every seed
    (the seeds score the *same* problems, so drawing them independently per seed would count each
    problem once per seed and narrow the interval), and draws the seeds with replacement."""
    data = torch.as_tensor(per_seed, dtype=torch.float64)  # [S, E]
    s, e = data.shape
    gen = torch.Generator().manual_seed(seed)
    seeds = torch.randint(0, s, (reps, s, 1), generator=gen).expand(reps, s, e)
    probs = torch.randint(0, e, (reps, 1, e), generator=gen).expand(reps, s, e)
    return data[seeds, probs].mean(dim=(1, 2))


def hierarchical_bootstrap(
    per_seed: Sequence[Sequence[float]], reps: int = 10000, seed: int = 0
) -> tuple[float, float]:
    """95% percentile interval of the mean over seeds and problems (:func:`bootstrap_means`)."""
    q = torch.quantile(
        bootstrap_means(per_seed, reps, seed), torch.tensor([0.025, 0.975], dtype=torch.float64)
    )
    return float(q[0]), float(q[1])


def difference_means(
    a: Sequence[Sequence[float]], b: Sequence[Sequence[float]], reps: int = 10000, seed: int = 0
) -> torch.Tensor:
    """``[reps]`` two-level bootstrap replicates of ``mean(a) - mean(b)`` (``a``: ``[S_a][E]`` per-seed,
    per-problem values of one row, ``b``: ``[S_b][E]`` another's, the same ``E`` held-out problems in
    the same order).

    Each replicate draws the problems with replacement once, shared by both rows and all their seeds
    (both rows score the *same* problems: a hard problem is hard for both, as in :func:`bootstrap_means`),
    and each row's seeds with replacement independently of the other's (the rows' runs are not paired:
    seed ``s`` of one and of the other share a seed number, not their samples, pairs or updates).

    Raises:
        ValueError: ``a`` and ``b`` score different numbers of problems."""
    da = torch.as_tensor(a, dtype=torch.float64)  # [S_a, E]
    db = torch.as_tensor(b, dtype=torch.float64)  # [S_b, E]
    if da.shape[1] != db.shape[1]:
        raise ValueError(
            f"difference_means: the rows score {da.shape[1]} and {db.shape[1]} problems; they must score the same ones"
        )
    e, gen = da.shape[1], torch.Generator().manual_seed(seed)
    probs = torch.randint(0, e, (reps, 1, e), generator=gen)
    means = []
    for d in (da, db):
        seeds = torch.randint(0, d.shape[0], (reps, d.shape[0], 1), generator=gen)
        shape = (reps, d.shape[0], e)
        means.append(d[seeds.expand(shape), probs.expand(shape)].mean(dim=(1, 2)))
    return means[0] - means[1]


def gain_difference(a: Sequence[Sequence[float]], b: Sequence[Sequence[float]]) -> dict[str, Any]:
    """Row ``a``'s mean gain minus row ``b``'s (per-seed, per-problem gains, ``[S][E]`` each), its 95%
    percentile interval and standard error over :func:`difference_means`' replicates; ``ci_independent``:
    the interval were the problems drawn independently per row (each row's own :func:`bootstrap_means`),
    as if the rows had scored different problems (a reader's check of how much the shared draw narrows it)."""
    levels = torch.tensor([0.025, 0.975], dtype=torch.float64)
    reps = difference_means(a, b)
    q = torch.quantile(reps, levels)
    qi = torch.quantile(bootstrap_means(a, seed=1) - bootstrap_means(b, seed=2), levels)
    mean = lambda xs: sum(map(sum, xs)) / sum(map(len, xs))  # noqa: E731
    return {
        "difference": mean(a) - mean(b),
        "ci": (float(q[0]), float(q[1])),
        "se": float(reps.std()),
        "ci_independent": (float(qi[0]), float(qi[1])),
    }


def summarize(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per algorithm: held-out success before and after (mean, 95% interval), the gain and its
    interval, the smallest gain detectable at 80% power (2.8 x the bootstrap SE), the curve."""
    out: dict[str, Any] = {}
    gains: dict[str, list[list[float]]] = {}
    for algorithm in dict.fromkeys(r["algorithm"] for r in runs):
        rs = sorted((r for r in runs if r["algorithm"] == algorithm), key=lambda r: r["seed"])
        before = [r["history"][0]["solved"] for r in rs]
        after = [r["history"][-1]["solved"] for r in rs]
        gain = [[a - b for a, b in zip(x, y)] for x, y in zip(after, before)]
        se, gains[algorithm] = float(bootstrap_means(gain).std()), gain
        curve = [[sum(h["solved"]) / len(h["solved"]) for h in r["history"]] for r in rs]
        mean = lambda xs: sum(map(sum, xs)) / sum(map(len, xs))  # noqa: E731
        out[algorithm] = {
            "seeds": [r["seed"] for r in rs],
            "n_problems": len(before[0]),
            "samples": rs[0]["history"][-1]["samples"],
            "before": mean(before),
            "before_ci": hierarchical_bootstrap(before),
            "after": mean(after),
            "after_ci": hierarchical_bootstrap(after),
            "gain": mean(gain),
            "gain_ci": hierarchical_bootstrap(gain),
            "gain_se": se,
            "min_detectable_gain": 2.8 * se,
            "curve_samples": [h["samples"] for h in rs[0]["history"]],
            "curves": curve,
            "wall_s": sum(r["wall_s"] for r in rs),
            "wall_s_per_seed": [r["wall_s"] for r in rs],
            "loadavg": [min(r["loadavg_start"][0] for r in rs), max(r["loadavg_end"][0] for r in rs)],
            "final_texts": rs[-1]["final_texts"],
        }
        if "marlhf" in rs[0]:  # phase 1 of each seed: pairs, reward-model fit; the labels (task-reward calls)
            out[algorithm]["marlhf"] = [r["marlhf"] for r in rs]
            m = rs[0]["marlhf"]  # the first design recorded no count: its pair prompts x K x 2 agents
            out[algorithm]["labelled"] = (
                m.get("labelled_samples") or m["pair_prompts"] * m["pair_candidates"] * 2
            )
        if "one_shot" in rs[0]:  # each seed's pair set and updates
            out[algorithm]["one_shot"] = [r["one_shot"] for r in rs]
        if "iterative" in rs[0]:  # each seed's pairs per round and updates
            out[algorithm]["iterative"] = [r["iterative"] for r in rs]
        if "comlrl_madpo" in rs[0]:  # each seed's CoMLRL pair set and updates
            out[algorithm]["comlrl_madpo"] = [r["comlrl_madpo"] for r in rs]
        if all("parse_failure" in h for r in rs for h in r["history"]):  # centralized: per eval, seed mean
            fails = [[h["parse_failure"] for h in r["history"]] for r in rs]
            out[algorithm]["parse_failure"] = [sum(c) / len(c) for c in zip(*fails)]
            out[algorithm]["max_new_tokens"] = rs[0].get("max_new_tokens")
    if "madpo_iter" in gains and "madpo_one_shot" in gains:  # the same budget: iterative minus one-shot
        out["madpo_iter"]["minus_one_shot"] = gain_difference(gains["madpo_iter"], gains["madpo_one_shot"])
    # the same problems and settings: ours (one-shot) minus CoMLRL's
    if "comlrl_madpo" in gains and "madpo_one_shot" in gains:
        out["comlrl_madpo"]["one_shot_minus"] = gain_difference(
            gains["madpo_one_shot"], gains["comlrl_madpo"]
        )
    return out


def plot(summary: dict[str, Any], path: str, title: str) -> None:
    """Held-out success against samples: mean over seeds per algorithm, thin lines per seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4.5))
    for n, (name, s) in enumerate(summary.items()):
        x, curves = list(s["curve_samples"]), [list(c) for c in s["curves"]]
        color = f"C{n}"
        # one-shot: every sample is spent before the first update, so the untrained success holds until x = 192
        ds = "steps-post" if "one_shot" in s else "default"
        marker = "o" if "iterative" in s else None  # iterative: held-out before and after only
        label = f"{name} (mean of {len(s['curves'])} seeds)"
        if "labelled" in s and len(x) > 1 and x[1] > s["labelled"]:
            # MARLHF: phase 1 leaves the agents untouched, so the untrained success holds until its labels end
            x.insert(1, s["labelled"])
            curves = [c[:1] + c for c in curves]
            label = f"{name} ({s['labelled']} labelled of {x[-1]}; mean of {len(curves)} seeds)"
            if name == "marlhf":
                ax.axvline(s["labelled"], color=color, linestyle=":", linewidth=1)
        for c in curves:
            ax.plot(x, c, color=color, alpha=0.3, linewidth=0.8, drawstyle=ds)
        mean = [sum(c[i] for c in curves) / len(curves) for i in range(len(x))]
        ax.plot(x, mean, color=color, linewidth=2, label=label, drawstyle=ds, marker=marker)
    ax.set_xlabel("completions sampled (both agents); MARLHF: labels end at the dotted line")
    ax.set_ylabel(f"held-out success (greedy, {NUM_HELD_OUT} problems)")
    ax.set_title(title)
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside: curves reach x = 384
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
