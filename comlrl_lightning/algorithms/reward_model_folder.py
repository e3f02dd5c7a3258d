"""MARLHF's reward-model folder: phase 1 run in it, resumed from it, or its finished model reused,
only when the config recorded there (:func:`reward_recipe`) is the given one.

A folder holds ``phase1_state.pt`` while phase 1 trains (pairs, weights, optimizer, order, RNG) and,
once done, the HF sequence classifier with ``pairs.jsonl`` and ``marlhf.json`` (written last). Both
record the *recipe*: what decides the trained model (backbone, reward-model training knobs, how the
pairs are made, or the pair file's content). A second run pointed at the folder with another recipe
(other pairs, another learning rate, ...) is refused, naming each difference, instead of silently
reusing a model trained for something else.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import torch
from torch import nn

from comlrl_lightning.algorithms.joint_reward_model import (
    RewardFitState,
    RewardModelConfig,
    fit_reward_model,
    save_reward_model,
)
from comlrl_lightning.core.pairs import PreferencePair, write_pairs
from comlrl_lightning.envs.reward_model import RewardModelReward
from comlrl_lightning.infra.checkpoint_io import atomic_torch_save
from comlrl_lightning.infra.resume_config import flatten
from comlrl_lightning.infra.rng import collect_rng_states
from comlrl_lightning.infra.run_lock import hold_run_folder

_NOT_IN_RECIPE = ("reward_model_dir", "reward_batch_size", "log_task_reward")
"""Reward-model fields that do not change the trained model (where it lives, scoring batch, logging)."""


def reward_recipe(module: Any) -> dict[str, Any]:
    """What decides MARLHF's trained reward model, as recorded in its folder: the backbone, the
    ``reward_model`` training knobs (less :data:`_NOT_IN_RECIPE`) and the pairs: the pair file's
    SHA-256 when ``pair_source.pairs_path`` is given, else the agents' models, ``preference`` and
    ``pair_source`` (the pairs are built from the initial policy's rollouts)."""
    cfg, source = module.reward_config, module.pair_source
    recipe: dict[str, Any] = {
        "source": cfg.reward_model or module.specs[0].model,
        "reward_model": {k: v for k, v in asdict(cfg).items() if k not in _NOT_IN_RECIPE},
    }
    if source.pairs_path is not None:
        with open(source.pairs_path, "rb") as f:
            recipe["pairs_sha256"] = hashlib.sha256(f.read()).hexdigest()
    else:
        recipe["agents"] = [spec.model for spec in module.specs]
        recipe["preference"] = asdict(module.preference_config)
        recipe["pair_source"] = asdict(source)
    return json.loads(json.dumps(recipe))  # as it reads back from marlhf.json (tuples -> lists)


def check_recipe(folder: str, what: str, recorded: dict[str, Any] | None, recipe: dict[str, Any]) -> None:
    """Refuse ``folder``'s ``what`` (its finished model, its phase-1 state) when its ``recorded``
    recipe is missing or differs from ``recipe``.

    Raises:
        ValueError: naming ``reward_model.reward_model_dir``, the folder and each differing field
            with the folder's and the given value.
    """
    if recorded == recipe:
        return
    if recorded is None:
        detail = "it records no config (written by an earlier version)"
    else:
        old, new = flatten(recorded, "", {}), flatten(recipe, "", {})
        diffs = [
            f"{k}: folder {old.get(k, '<absent>')!r}, given {new.get(k, '<absent>')!r}"
            for k in sorted(set(old) | set(new))
            if old.get(k, "<absent>") != new.get(k, "<absent>")
        ]
        detail = "it was made with another config:\n  " + "\n  ".join(diffs)
    raise ValueError(
        f"reward_model.reward_model_dir: {folder!r} holds {what}, but {detail}\nnot reusing it: point "
        "reward_model.reward_model_dir at another folder, remove this one, or give the folder's values"
    )


def reward_phase(
    model: nn.Module,
    tok: Any,
    reward: RewardModelReward,
    cfg: RewardModelConfig,
    folder: str,
    make_pairs: Callable[[], list[PreferencePair]],
    log: Callable[[dict[str, float], int], None] | None = None,
    after_epoch: Callable[[int], None] | None = None,
    recipe: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """MARLHF's phase 1 in ``folder``: a finished model there (``marlhf.json``) is loaded into
    ``model``; else the pairs (``make_pairs()``, or those of a saved ``phase1_state.pt``) train it
    (:func:`~comlrl_lightning.algorithms.joint_reward_model.fit_reward_model`, resuming that state),
    then it is saved (``save_reward_model``, with ``pairs.jsonl``) and the state file removed. Both
    files record ``recipe`` (:func:`reward_recipe`); a folder whose record differs is refused
    (:func:`check_recipe`) unless ``recipe`` is None.

    Returns:
        The folder's ``marlhf.json`` record.

    Raises:
        ValueError: the folder's recorded recipe is not ``recipe``.
        RunFolderBusy: another running process trains in the folder (``infra/run_lock.py``).
    """
    done = os.path.join(folder, "marlhf.json")
    if os.path.exists(done):
        with open(done, encoding="utf-8") as f:
            info = json.load(f)
        if recipe is not None:
            check_recipe(folder, "a finished reward model", info.get("recipe"), recipe)
        from transformers import AutoModelForSequenceClassification

        model.load_state_dict(AutoModelForSequenceClassification.from_pretrained(folder).state_dict())
        return info
    hold_run_folder(folder, "reward_model.reward_model_dir")  # one run trains in it (a finished one: shared)
    state_path = os.path.join(folder, "phase1_state.pt")
    if os.path.exists(state_path):
        saved = torch.load(state_path, weights_only=False)
        recorded = saved.pop("recipe", None)
        if recipe is not None:
            check_recipe(folder, "a reward model in training", recorded, recipe)
        state = RewardFitState(**saved)
    else:
        pairs = make_pairs()
        state = RewardFitState(pairs=[p.to_json() for p in pairs], rng_states=collect_rng_states())
        os.makedirs(folder, exist_ok=True)
        atomic_torch_save({**vars(state), "recipe": recipe}, state_path)
    record = {"recipe": recipe}
    state = fit_reward_model(model, tok, reward, state, cfg, state_path, log, after_epoch, record)
    write_pairs(os.path.join(folder, "pairs.jsonl"), [PreferencePair.from_json(d) for d in state.pairs])
    info = {
        "template": cfg.reward_template,
        "max_length": reward.max_length,
        "source": (recipe or {}).get("source", ""),
        "num_pairs": len(state.pairs),
        "skipped_steps": state.skipped_steps,
        "history": state.history,
        "recipe": recipe,
    }
    save_reward_model(model, tok, folder, info)
    os.remove(state_path)
    return info
