"""The coordinator's row of the learning benchmark: its own task (a proposer answers, a reviser sees
the draft and answers), its calibration and its runs through :class:`comlrl_lightning.coordinator.Coordinator`.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from typing import Any

import torch
from bench_lib import SMOLLM2
from learning_config import CONFIG
from learning_tasks import (
    COORD_SCHEDULE,
    COORD_TASKS,
    PROPOSER_PROMPT,
    REVISER_PROMPT,
    TASK_RULE,
    held_out_and_train,
    last_integer,
    rule_pick,
)

from comlrl_lightning.envs.rewards import PASS_AT_1, RewardResult


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
