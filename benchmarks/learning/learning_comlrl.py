"""The ``comlrl_madpo`` row of the learning benchmark: CoMLRL's own ``MADPOTrainer`` on the one-shot
row's problems and settings (:data:`~learning_config.COMLRL_MADPO_CONFIG`), evaluated by our module.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
from learning_config import COMLRL_MADPO_CONFIG, CONFIG, one_shot_problems, one_shot_samples
from learning_tasks import TASKS, ExactMatchReward, HeldOut, _quiet_trainer, datamodule
from learning_train import build_module, run_record


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
