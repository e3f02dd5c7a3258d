"""Credit-assignment benchmark: does per-agent credit learn faster under one shared reward?

Task: :class:`~comlrl_lightning.envs.toy.TeamTargetsReward`, three agents whose contributions differ
(agent 0 matters most, agent 1 pays only when agent 0 is close, agent 2 barely matters; max 1.0).
Agents: tabular policies, one categorical distribution per agent over ``A`` completion lengths
(completion text ``"x" * 2a``), so the comparison isolates the credit estimator: every mode draws
the same number of completions per step from the same seeds, calls the same reward on real texts,
and updates with the same loss (``core.loss``, ``sequence_sum``, Adam); only the advantage
differs (``core.credit`` / ``core.advantages``, all with ``scale_rewards="group"``).

Per run it records the mean aligned reward per step, the samples (completions, all agents) until a
5-step moving mean first reaches the threshold (0.85, and 0.95 where the
barely-mattering agents must get it right too), the final reward (mean of the last 10 steps), each
agent's advantage variance before std scaling, the correlation of each agent's advantage with its
*true* advantage (the expected reward of its action given the teammates' current policies minus
its expectation, exact for this multilinear reward), reward calls per step and wall time per step.

    python benchmarks/learning/credit.py            # prints the table; benchmarks/run.py --only credit writes it
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any

import torch

from comlrl_lightning.core.advantages import group_advantages, scale_by_std
from comlrl_lightning.core.credit import counterfactual_advantages, credit_index, cross_rewards_advantages
from comlrl_lightning.core.loss import BatchTotals, clipped_surrogate, reduce_loss
from comlrl_lightning.envs.base import Episode
from comlrl_lightning.envs.toy import TeamTargetsReward

MODES = {  # name -> (credit, advantage_mode)
    "mean": ("shared", "mean"),
    "rloo": ("shared", "rloo"),
    "counterfactual": ("counterfactual", "mean"),
    "cross_rewards": ("cross_rewards", "mean"),
}
SETUP = {"num_agents": 3, "num_actions": 16, "k": 4, "episodes_per_step": 4, "steps": 150, "lr": 0.05,
         "threshold": 0.85, "threshold_high": 0.95, "seeds": [0, 1, 2, 3, 4]}  # fmt: skip


def _length(action: int) -> int:
    return 2 * action


def _true_advantages(reward: TeamTargetsReward, probs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Agent i's exact advantage of every action, ``[A]`` each, given the teammates' policies."""
    a = probs[0].shape[0]
    close = [torch.tensor([reward.closeness(i, _length(x)) for x in range(a)]) for i in range(3)]
    expected = [float((p * c).sum()) for p, c in zip(probs, close)]
    out = []
    for i in range(3):
        q = torch.tensor([reward.combine([float(close[i][x]) if j == i else expected[j] for j in range(3)])
                          for x in range(a)])  # fmt: skip
        out.append(q - (probs[i] * q).sum())
    return out


def run_one(mode: str, seed: int, setup: dict[str, Any] = SETUP) -> dict[str, Any]:
    """One training run of ``mode`` from ``seed``; see the module docstring for what it records."""
    credit, adv_mode = MODES[mode]
    n, a, k, b = setup["num_agents"], setup["num_actions"], setup["k"], setup["episodes_per_step"]
    reward = TeamTargetsReward()
    episodes = [Episode(index=e) for e in range(b)]
    gen = torch.Generator().manual_seed(seed)
    logits = [torch.zeros(a, requires_grad=True) for _ in range(n)]
    opts = [torch.optim.Adam([lg], lr=setup["lr"]) for lg in logits]
    index = credit_index(n, k, credit)
    m = index.num_reward_calls
    ones = torch.ones(b * k, 1)
    rewards, step_s, adv_var, adv_corr = [], [], [[] for _ in range(n)], [[] for _ in range(n)]
    for _ in range(setup["steps"]):
        t0 = time.perf_counter()
        probs = [torch.softmax(lg.detach(), -1) for lg in logits]
        acts = [torch.multinomial(p, b * k, replacement=True, generator=gen).view(b, k) for p in probs]
        joint = [
            ["x" * _length(int(acts[i][e, row[i]])) for i in range(n)]
            for e in range(b)
            for row in index.joint_index
        ]
        r = torch.tensor(reward(joint, [episodes[e] for e in range(b) for _ in range(m)], 0)).view(b, m)
        if credit == "shared":
            scores = [r] * n
            adv = [group_advantages(r, adv_mode, "none")] * n
        elif credit == "counterfactual":
            adv, scores = counterfactual_advantages(r, index, adv_mode)
        else:
            adv, scores = cross_rewards_advantages(r, index, n, adv_mode)
        scaled = scale_by_std(adv, scores, "group")
        for i in range(n):
            opts[i].zero_grad(set_to_none=True)
            logp = torch.log_softmax(logits[i], -1)[acts[i].flatten()][:, None]  # [B·K, 1]: one "token"
            per_tok, _, _ = clipped_surrogate(logp, None, scaled[i].flatten(), ones)
            reduce_loss(per_tok, ones, "sequence_sum", BatchTotals(b * k, b * k)).backward()
            opts[i].step()
        step_s.append(time.perf_counter() - t0)
        rewards.append(float(r[:, :k].mean()))
        truth = _true_advantages(reward, probs)
        for i in range(n):
            est, true = adv[i].flatten(), truth[i][acts[i].flatten()]
            adv_var[i].append(float(est.var()))
            if est.std() > 0 and true.std() > 0:
                adv_corr[i].append(float(torch.corrcoef(torch.stack([est, true]))[0, 1]))
    samples_per_step = n * b * k
    moving = [statistics.fmean(rewards[max(0, s - 4) : s + 1]) for s in range(len(rewards))]
    hits = [
        next((s for s, v in enumerate(moving) if s >= 4 and v >= setup[key]), None)
        for key in ("threshold", "threshold_high")
    ]
    return {
        "rewards": rewards,
        "samples_to_threshold": None if hits[0] is None else (hits[0] + 1) * samples_per_step,
        "samples_to_threshold_high": None if hits[1] is None else (hits[1] + 1) * samples_per_step,
        "final_reward": statistics.fmean(rewards[-10:]),
        "adv_var": [statistics.fmean(v) for v in adv_var],
        "adv_corr": [statistics.fmean(c) if c else float("nan") for c in adv_corr],
        "reward_calls_per_step": b * m,
        "step_s": statistics.median(step_s),
        "samples_per_step": samples_per_step,
    }


def _spread(xs: list[float]) -> dict[str, float]:
    return {
        "mean": statistics.fmean(xs),
        "sd": statistics.stdev(xs) if len(xs) > 1 else 0.0,
        "min": min(xs),
        "max": max(xs),
    }


def run(quick: bool = False) -> dict[str, Any]:
    """Every mode on every seed, modes interleaved per seed (so machine load hits them alike)."""
    setup = dict(SETUP, seeds=SETUP["seeds"][:3], steps=60) if quick else dict(SETUP)
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    for seed in setup["seeds"]:
        for mode in MODES:
            runs[mode].append(run_one(mode, seed, setup))
    out: dict[str, Any] = {"setup": setup, "modes": {}}
    for mode, rs in runs.items():
        rec: dict[str, Any] = {}
        for key in ("samples_to_threshold", "samples_to_threshold_high"):
            reached = [r[key] for r in rs if r[key] is not None]
            rec[key] = _spread(reached) if reached else None
            rec[key.replace("samples_to", "reached")] = f"{len(reached)}/{len(rs)}"
        out["modes"][mode] = {
            **rec,
            "final_reward": _spread([r["final_reward"] for r in rs]),
            "adv_var": [_spread([r["adv_var"][i] for r in rs]) for i in range(setup["num_agents"])],
            "adv_corr": [_spread([r["adv_corr"][i] for r in rs]) for i in range(setup["num_agents"])],
            "reward_calls_per_step": rs[0]["reward_calls_per_step"],
            "step_s": _spread([r["step_s"] for r in rs]),
            "samples_per_step": rs[0]["samples_per_step"],
            "curves": [r["rewards"] for r in rs],
        }
    base = out["modes"]["mean"]
    for rec in out["modes"].values():
        rec["step_time_over_mean"] = rec["step_s"]["mean"] / base["step_s"]["mean"]
        rec["reward_calls_over_mean"] = rec["reward_calls_per_step"] / base["reward_calls_per_step"]
    return out


def plot(
    curves: dict[str, list[list[float]]],
    samples_per_step: int,
    path: str,
    title: str,
    threshold: float | None,
    smooth: int = 5,
) -> None:
    """Reward per step (moving mean over ``smooth`` steps) against samples: one line per system (mean
    over seeds), min-max band over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for n, (name, runs) in enumerate(curves.items()):
        t = torch.tensor(runs, dtype=torch.float)  # [seeds, steps]
        t = torch.stack([t[:, max(0, s - smooth + 1) : s + 1].mean(1) for s in range(t.shape[1])], 1)
        x = [(s + 1) * samples_per_step for s in range(t.shape[1])]
        ax.plot(
            x, t.mean(0).tolist(), label=name, linestyle=("-", "--")[n % 2]
        )  # dashes: coinciding lines stay visible
        if t.shape[0] > 1:
            ax.fill_between(x, t.min(0).values.tolist(), t.max(0).values.tolist(), alpha=0.15)
    if threshold is not None:
        ax.axhline(threshold, color="grey", linestyle=":", linewidth=1, label=f"threshold {threshold}")
    ax.set_xlabel("samples (completions, all agents)")
    ax.set_ylabel(f"shared reward ({smooth}-step moving mean)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def llm_cost(quick: bool = False) -> dict[str, Any]:
    """What each mode costs per step with LLM agents: ``MAGRPO`` on three tiny GPT-2 agents and the
    same task (completion lengths in characters), step time from ``StepOutput.step_time_s`` (rollout
    and update), median after two warm-up steps, modes interleaved over rounds so load hits them alike."""
    import lightning.pytorch as pl

    from comlrl_lightning import MAGRPO, RolloutConfig, SamplingConfig
    from comlrl_lightning.datamodules import DecPOMDPDataModule

    class Clock(pl.Callback):
        def __init__(self) -> None:
            self.seen: list[float] = []

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            self.seen.append(float(outputs["step_time_s"]))

    steps, rounds = (4, 1) if quick else (10, 3)
    rows = [{"topic": f"topic {i}"} for i in range(steps * 2)]
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    calls: dict[str, int] = {}
    for _ in range(rounds):
        for mode, (credit, adv_mode) in MODES.items():
            torch.manual_seed(0)
            model = MAGRPO(agents="builtin:tiny-gpt2", num_agents=3, learning_rate=1e-3,
                           rollout=RolloutConfig(num_generations=4, credit=credit),
                           advantage={"advantage_mode": adv_mode}, sampling=SamplingConfig(max_new_tokens=16))  # fmt: skip
            data = DecPOMDPDataModule(
                rows, ["Write about {topic}:"] * 3, TeamTargetsReward(), batch_size=2, shuffle=False
            )
            clock = Clock()
            pl.Trainer(max_steps=steps * 3, accelerator="cpu", logger=False, enable_checkpointing=False,
                       enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                       callbacks=[clock]).fit(model, data)  # fmt: skip
            times[mode] += clock.seen[2:]
            calls[mode] = 2 * model.rollout_config.reward_calls_per_episode(3)
    base = statistics.median(times["mean"])
    return {mode: {"step_s": statistics.median(t), "over_mean": statistics.median(t) / base,
                   "reward_calls_per_step": calls[mode], "steps": len(t)} for mode, t in times.items()}  # fmt: skip


def section(quick: bool) -> dict[str, Any]:
    """``benchmarks/run.py``'s ``credit`` section: :func:`run` and the LLM cost (plotted by :func:`plot_section`)."""
    res = run(quick)
    res["llm_cost"] = llm_cost(quick)
    return res


def plot_section(res: dict[str, Any], png_path: str) -> None:
    """The reward-vs-samples plot of a :func:`section` result."""
    st = res["setup"]
    curves = {mode: rec["curves"] for mode, rec in res["modes"].items()}
    plot(curves, st["num_agents"] * st["k"] * st["episodes_per_step"], png_path,
         f"credit modes, {len(st['seeds'])} seeds (band: min-max)", st["threshold"])  # fmt: skip


def _pm(x: dict[str, float] | None, nd: int = 0, scale: float = 1.0) -> str:
    return "n/a" if x is None else f"{x['mean'] * scale:.{nd}f} ± {x['sd'] * scale:.{nd}f}"


def render(res: dict[str, Any]) -> str:
    """The credit section of RESULTS.md: one row per mode, mean ± sd over seeds, and the verdict."""
    st, modes = res["setup"], res["modes"]
    head = ("Mode", f"Samples to {st['threshold']} (reached)", f"Samples to {st['threshold_high']} (reached)",
            "Final reward", "Adv. variance per agent (before scaling)", "Corr(adv, true adv) per agent",
            "Reward calls / step (÷ mean)", "Step time ms (÷ mean)")  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for mode, r in modes.items():
        lines.append("| " + " | ".join([
            f"`{mode}`",
            f"{_pm(r['samples_to_threshold'])} ({r['reached_threshold']})",
            f"{_pm(r['samples_to_threshold_high'])} ({r['reached_threshold_high']})",
            _pm(r["final_reward"], 3),
            " / ".join(f"{v['mean']:.4f}" for v in r["adv_var"]),
            " / ".join(f"{c['mean']:.2f} ± {c['sd']:.2f}" for c in r["adv_corr"]),
            f"{r['reward_calls_per_step']} ({r['reward_calls_over_mean']:.1f}x)",
            f"{_pm(r['step_s'], 2, 1e3)} ({r['step_time_over_mean']:.2f}x)",
        ]) + " |")  # fmt: skip
    if "llm_cost" in res:
        lines += ["", "Cost per step with LLM agents (`MAGRPO`, three tiny GPT-2 agents, K=4, B=2, 16 new tokens; "
                  "rollout + update, median over steps, modes interleaved; `rloo` does exactly `mean`'s work, so its "
                  "ratio shows the noise of this shared machine):", "",
                  "| Mode | Reward calls / step | Step time s | ÷ `mean` |", "|---|---|---|---|"]  # fmt: skip
        for mode, r in res["llm_cost"].items():
            lines.append(
                f"| `{mode}` | {r['reward_calls_per_step']} | {r['step_s']:.3f} | {r['over_mean']:.2f}x |"
            )
    return "\n".join(lines) + "\n\n" + verdict(res)


def verdict(res: dict[str, Any]) -> str:
    """One sentence per credit mode: faster than ``mean`` to each threshold beyond the seeds' spread?"""
    modes, st = res["modes"], res["setup"]
    out = []
    for mode in ("counterfactual", "cross_rewards"):
        parts = []
        for key, thr in (
            ("samples_to_threshold", st["threshold"]),
            ("samples_to_threshold_high", st["threshold_high"]),
        ):
            a, b = modes[mode][key], modes["mean"][key]
            reached = [modes[m][key.replace("samples_to", "reached")] for m in (mode, "mean")]
            if a is None or b is None or any(r.split("/")[0] != r.split("/")[1] for r in reached):
                parts.append(f"to {thr}: not reached on every seed ({reached[0]} vs {reached[1]} for `mean`)")
                continue
            gap, spread = b["mean"] - a["mean"], a["sd"] + b["sd"]
            word = "fewer" if gap > 0 else "more"
            sure = "beyond" if abs(gap) > spread else "within"
            parts.append(f"to {thr}: {abs(gap) / b['mean']:.0%} {word} samples than `mean` "
                         f"({a['mean']:.0f} vs {b['mean']:.0f}, gap {sure} the summed sd {spread:.0f})")  # fmt: skip
        r = modes[mode]
        llm = res.get("llm_cost", {}).get(mode)
        llm_part = f", {llm['over_mean']:.2f}x with tiny GPT-2 agents" if llm else ""
        out.append(f"- **`{mode}`**: " + "; ".join(parts) + f". Cost: {r['reward_calls_over_mean']:.0f}x the reward "
                   f"calls per step, no extra generation; {r['step_time_over_mean']:.2f}x the step time with tabular "
                   f"agents{llm_part}.")  # fmt: skip
    return "\n".join(out)


NOTES = """\
Task and method (`benchmarks/learning/credit.py`): `TeamTargetsReward`, three agents, shared reward
`0.6·c0 + 0.35·c0·c1 + 0.05·c2` (agent 0 matters most, agent 1 pays only when agent 0 is close, agent 2
barely matters; `c_i` is the closeness of agent i's completion length to its target). Tabular policies
(one categorical distribution per agent over 16 completion lengths), so only the credit estimator
differs: per step every mode draws B=4 episodes × K=4 completions per agent from the same seeds, calls
the same reward on the texts, and takes one Adam step per agent (lr 0.05, `sequence_sum`,
`scale_rewards="group"`). Samples count completions of all agents (48 per step); "samples to" is the
first step at which the 5-step moving mean of the aligned reward reaches the threshold. Advantage
variance is the within-step variance before std scaling, averaged over steps (the shared modes give
every agent the same advantages); the correlation is with each agent's exact advantage (expected
reward of its action given the teammates' current policies, minus its mean). Under group std scaling
`rloo` is `mean` times K/(K−1) before the division, so the two train alike (CoMLRL's docs say the
same of its modes under normalisation). Step times are medians
per run on this shared 2-core machine, for the whole tabular step (sampling, reward calls, credit,
update): with tabular agents the reward calls are a large part of a step, so the time ratio is an
upper bound for LLM agents, whose step is dominated by generation, which no credit mode adds to.
"""


if __name__ == "__main__":
    res = run(quick="--quick" in sys.argv)
    for mode, rec in res["modes"].items():
        s = rec["samples_to_threshold"]
        hit = "n/a" if s is None else f"{s['mean']:.0f}±{s['sd']:.0f}"
        print(f"{mode:15s} samples->thr {hit} ({rec['reached_threshold']}) "
              f"final {rec['final_reward']['mean']:.3f}±{rec['final_reward']['sd']:.3f} "
              f"corr {[round(c['mean'], 2) for c in rec['adv_corr']]} var {[round(v['mean'], 4) for v in rec['adv_var']]} "
              f"calls/step {rec['reward_calls_per_step']} step {rec['step_s']['mean'] * 1e3:.2f} ms")  # fmt: skip
