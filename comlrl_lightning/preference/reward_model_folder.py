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

import functools
import hashlib
import inspect
import json
import os
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import nn

from comlrl_lightning.envs.reward_model import RewardModelReward
from comlrl_lightning.infra.checkpoint_io import atomic_torch_save
from comlrl_lightning.infra.resume_config import flatten
from comlrl_lightning.infra.rng import collect_rng_states
from comlrl_lightning.infra.run_lock import hold_run_folder
from comlrl_lightning.preference.joint_reward_model import (
    RewardFitState,
    RewardModelConfig,
    fit_reward_model,
    save_reward_model,
)
from comlrl_lightning.preference.pairs import PreferencePair, write_pairs

_NOT_IN_RECIPE = ("reward_model_dir", "reward_batch_size", "log_task_reward")
"""Reward-model fields that do not change the trained model (where it lives, scoring batch, logging)."""


def reward_recipe(module: Any) -> dict[str, Any]:
    """What decides MARLHF's trained reward model, as recorded in its folder: the backbone, the
    ``reward_model`` training knobs (less :data:`_NOT_IN_RECIPE`), the global seed (the pairs' and
    the training order's RNG) and the pairs: the pair file's SHA-256 when ``pair_source.pairs_path``
    is given, else what builds them from the initial policy's rollouts: the agents' models,
    ``preference``, ``pair_source``, the prompts used (:func:`prompts_fingerprint`) and the task
    reward that ranks the candidates (:func:`reward_identity`)."""
    cfg, source = module.reward_config, module.pair_source
    recipe: dict[str, Any] = {
        "source": cfg.reward_model or module.specs[0].model,
        "reward_model": {k: v for k, v in asdict(cfg).items() if k not in _NOT_IN_RECIPE},
        "seed": global_seed(),
    }
    if source.pairs_path is not None:
        with open(source.pairs_path, "rb") as f:
            recipe["pairs_sha256"] = hashlib.sha256(f.read()).hexdigest()
    else:
        recipe["agents"] = [spec.model for spec in module.specs]
        recipe["preference"] = asdict(module.preference_config)
        recipe["pair_source"] = asdict(source)
        recipe.update(training_record(module, source.preference_num_prompts))
    return json.loads(json.dumps(recipe))  # as it reads back from marlhf.json (tuples -> lists)


def training_record(module: Any, num_prompts: int | None = None) -> dict[str, Any]:
    """Where a reward model's built pairs come from: ``{"prompts": ..., "task_reward": ...}`` of
    ``module`` (its trainer's training rows, the first ``num_prompts``; its env's reward)."""
    rows = getattr(getattr(module.trainer, "datamodule", None), "train_rows", None)
    return {
        "prompts": prompts_fingerprint(rows, num_prompts),
        "task_reward": reward_identity(module.env.reward_fn),
    }


def global_seed() -> int | None:
    """The seed of ``seed_everything`` (``--seed_everything``; Lightning keeps it in ``PL_GLOBAL_SEED``),
    None when none was set."""
    seed = os.environ.get("PL_GLOBAL_SEED")
    return int(seed) if seed is not None and seed.lstrip("-").isdigit() else None


def prompts_fingerprint(rows: Any, num_prompts: int | None) -> str | None:
    """``"sha256:<hex>"`` of the training rows pairs are built from (the first ``num_prompts``; None:
    all), each as sorted JSON; None without rows. A data file edited, another split or seed of the
    split, another ``num_train``: another fingerprint."""
    if rows is None:
        return None
    n = len(rows) if num_prompts is None else min(num_prompts, len(rows))
    digest = hashlib.sha256()
    for i in range(n):
        digest.update(json.dumps(dict(rows[i]), sort_keys=True, default=str).encode() + b"\n")
    return f"sha256:{digest.hexdigest()}"


def reward_identity(reward: Any) -> dict[str, Any]:
    """What a task reward is, as far as its config tells: each function's qualified name and its
    public plain settings (a ``functools.partial``'s arguments), the weights and the processor."""
    functions = getattr(reward, "functions", [reward])
    processor = getattr(reward, "processor", None)
    return {
        "functions": [_callable_identity(fn) for fn in functions],
        "weights": list(getattr(reward, "weights", [1.0])),
        "processor": None if processor is None else {k: v for k, v in vars(processor).items() if _plain(v)},
    }


def _callable_identity(fn: Any) -> dict[str, Any]:
    if isinstance(fn, functools.partial):
        inner = _callable_identity(fn.func)
        args = {"args": list(fn.args), "keywords": dict(fn.keywords)}
        return {**inner, "partial": {k: v for k, v in args.items() if _plain(v)}}
    named = fn if inspect.isroutine(fn) or inspect.isclass(fn) else type(fn)
    out: dict[str, Any] = {"name": f"{named.__module__}.{named.__qualname__}"}
    settings = {
        k: v for k, v in sorted(getattr(fn, "__dict__", {}).items()) if not k.startswith("_") and _plain(v)
    }
    if settings:
        out["settings"] = settings
    return out


def _plain(value: Any) -> bool:
    """A value JSON keeps as it is (numbers, strings, None, and lists / dicts of them)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False


_NEWER = ("seed", "prompts", "task_reward")
"""Recipe keys a folder of an earlier version does not record: not compared there, said so."""


def check_recipe(folder: str, what: str, recorded: dict[str, Any] | None, recipe: dict[str, Any]) -> None:
    """Refuse ``folder``'s ``what`` (its finished model, its phase-1 state) when its ``recorded``
    recipe is missing or differs from ``recipe``; say (one line) what is reused, and which of
    :data:`_NEWER` the folder does not record (an earlier version's: not compared).

    Raises:
        ValueError: naming ``reward_model.reward_model_dir``, the folder and each differing field
            with the folder's and the given value.
    """
    unrecorded = [k for k in _NEWER if recorded is not None and k in recipe and k not in recorded]
    compared = {k: v for k, v in recipe.items() if k not in unrecorded}
    if recorded is not None and compared == recorded:
        unsaid = (
            f"; it does not record {', '.join(unrecorded)} (an earlier version): not compared"
            if unrecorded
            else ""
        )
        rank_zero_info(
            f"reward_model.reward_model_dir: {folder!r} holds {what} made with this config (backbone, "
            f"training knobs, seed, pairs or what builds them){unsaid}: using it"
        )
        return
    if recorded is None:
        detail = "it records no config (written by an earlier version)"
    else:
        old, new = flatten(recorded, "", {}), flatten(compared, "", {})
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
    (:func:`~comlrl_lightning.preference.joint_reward_model.fit_reward_model`, resuming that state),
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
