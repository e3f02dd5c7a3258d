"""One training run of the learning benchmark through the library's public API: :func:`build_module`
(the algorithm's module), :func:`run_one` (held-out success before and during training) and the
record every run writes (:func:`run_record`); :func:`central_parse_probe` for centralized MAGRPO.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from typing import Any

import lightning.pytorch as pl
import torch
from bench_lib import SMOLLM2
from learning_config import (
    CONFIG,
    ITERATIVE_CONFIG,
    ITERATIVE_ROUNDS,
    MARLHF_CONFIG,
    ONE_SHOT_CONFIG,
    ONE_SHOT_EVAL,
    TASK,
    central_max_new_tokens,
    iterative_candidates,
    iterative_problems,
    iterative_walk,
    marlhf_pair_samples,
    marlhf_rl_batches,
    one_shot_num_problems,
    one_shot_problems,
    one_shot_samples,
)
from learning_tasks import (
    HERE,
    MAX_NEW_TOKENS,
    TASKS,
    HeldOut,
    _quiet_trainer,
    datamodule,
    held_out_and_train,
)


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
