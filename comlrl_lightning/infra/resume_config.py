"""What a resumed run may change: the given model config against the checkpoint's.

``fit --ckpt_path`` restores weights, optimizers and the loop from the checkpoint, but the module is
built from the config given now. Lightning's CLI would quietly replace that config with the
checkpoint's (``LightningCLI._parse_ckpt_path``); ``comlrl-lightning`` instead compares the two,
field by field, before any model loads (:func:`resume_differences`):

- a field that cannot change on resume (the module class, the team, what is optimised, how the
  data and the pairs are made) is refused: :class:`ResumeConfigError` names the field, the
  checkpoint's value and the given one;
- a safe one (:data:`RESUME_FIELDS` with :data:`APPLY`: step sizes, evaluation, logging, budgets,
  placement) is applied, one line each (:func:`applied_lines`);
- ``fit --use_checkpoint_config true`` takes the checkpoint's model config instead (Lightning's
  behaviour), naming each given value it ignores.

A changed learning rate reaches the optimizers: Lightning restores their ``param_groups`` (old rates) after
the module is built; :func:`apply_given_learning_rates` puts the given ones back (schedulers scaled to match).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_info

APPLY = "apply"
"""Policy: the given value is used by the resumed run (and said so in one line)."""
REFUSE = "refuse"
"""Policy: the resumed run stops before any model loads, naming the field."""
CLASS_KEY = "_class_path"
"""The hyperparameter under which Lightning's CLI records the module class."""
_SKIPPED = ("_instantiator",)
"""Hyperparameters that are Lightning's bookkeeping, not config."""
_STEP = "the optimizers take it after the checkpoint is restored (schedulers scaled to match)"
_WHERE = "where a model lives: the same computation"
_CLIP = "gradient clipping from the next step on"
_TRANSPORT = "how the comparator's API is reached, not what it answers"

RESUME_FIELDS: tuple[tuple[str, str, str], ...] = (
    (CLASS_KEY, REFUSE, "another algorithm: its state and loss differ from the checkpoint's"),
    ("rl_algorithm", REFUSE, "MARLHF's phase-2 algorithm: another module class"),
    ("num_agents", REFUSE, "the team's shape: one optimizer and one set of weights per agent"),
    ("agents.*.learning_rate", APPLY, _STEP),
    ("agents.*.device", APPLY, _WHERE),
    ("agents*", REFUSE, "the team: models, tokenizers, dtypes and shared weights of the saved agents"),
    ("critics.*.device", APPLY, _WHERE),
    ("learning_rate", APPLY, _STEP),
    ("critic.critic_learning_rate", APPLY, _STEP),
    ("critics.*.learning_rate", APPLY, _STEP),
    ("val_sampling", APPLY, "validation only"),
    ("rollout.num_generations_eval", APPLY, "validation only"),
    ("rollout.eval_pass_at_k", APPLY, "validation only"),
    ("rollout.eval_num_samples", APPLY, "validation only"),
    ("rollout.max_generations_per_episode", APPLY, "a budget check on the rollout tree, same rollouts"),
    ("rollout.max_reward_calls_per_episode", APPLY, "a budget check on the rollout tree, same rollouts"),
    ("loss.max_grad_norm", APPLY, _CLIP),
    ("dpo.max_grad_norm", APPLY, _CLIP),
    ("critic.critic_max_grad_norm", APPLY, _CLIP),
    ("loss.on_nonfinite", APPLY, "what a non-finite step does from the next step on"),
    ("dpo.on_nonfinite", APPLY, "what a non-finite step does from the next step on"),
    ("loss.micro_batch_size", APPLY, "memory only: the same gradients"),
    ("dpo.micro_batch_size", APPLY, "memory only: the same gradients"),
    ("placement.*", APPLY, _WHERE),
    ("comparator.comparator_devices", APPLY, _WHERE),
    ("comparator.comparator_api_url", APPLY, _TRANSPORT),
    ("comparator.comparator_api_headers", APPLY, _TRANSPORT),
    ("comparator.comparator_api_key_*", APPLY, _TRANSPORT),
    ("comparator.comparator_api_timeout", APPLY, _TRANSPORT),
    ("comparator.comparator_api_max_retries", APPLY, _TRANSPORT),
    ("comparator.comparator_api_retry_backoff", APPLY, _TRANSPORT),
    ("comparator.comparator_api_concurrency", APPLY, _TRANSPORT),
    ("comparator.comparator_max_consecutive_failures", APPLY, _TRANSPORT),
    ("comparator.policy_checkpoint_dir", APPLY, "the saved rounds' folders, checked there on resume"),
    ("replay.preference_replay_dir", APPLY, "the shards' folder, each shard's count checked there on resume"),
    ("reward_model.log_task_reward", APPLY, "logging only"),
    ("reward_model.reward_batch_size", APPLY, "scoring batch size: the same rewards"),
    ("reward_model.reward_model_dir", APPLY, "a phase-2 checkpoint holds the reward model's weights"),
    ("rollout.num_generations", REFUSE, "the group size: what each advantage and pair is made from"),
    ("rounds.*", REFUSE, "the round loop the checkpoint is inside of"),
    ("comparator.*", REFUSE, "who the current policy is compared with: the pairs"),
    ("*", REFUSE, "changes what is optimised, the rollouts, the pairs or the saved state's shape"),
)
"""Every model field a resumed run compares, first match wins: ``(dotted field pattern (fnmatch, list
indices as numbers: ``agents.1.model``), policy, why)``. Unlisted fields fall to the last row
(refuse): a field that is not known to be safe is not changed silently."""


class ResumeConfigError(ValueError):
    """The given config changes a field that cannot change on resume (:data:`RESUME_FIELDS`)."""


@dataclass(frozen=True)
class Difference:
    """One field whose given value differs from the checkpoint's.

    Attributes:
        field: dotted name (``rollout.num_generations``, ``agents.1.model``).
        saved: the checkpoint's value (``<absent>`` when it has none).
        given: the given config's value (``<absent>`` when it has none).
        policy: :data:`APPLY` or :data:`REFUSE`.
        why: the reason of the policy (:data:`RESUME_FIELDS`).
    """

    field: str
    saved: Any
    given: Any
    policy: str
    why: str

    def describe(self) -> str:
        return f"{self.field}: checkpoint {self.saved!r}, given {self.given!r}"


_ABSENT = "<absent>"


def policy_of(field: str) -> tuple[str, str]:
    """``(policy, why)`` of a dotted field: the first :data:`RESUME_FIELDS` row whose pattern matches."""
    for pattern, policy, why in RESUME_FIELDS:
        if fnmatchcase(field, pattern):
            return policy, why
    raise AssertionError("RESUME_FIELDS ends in a catch-all row")


def flatten(value: Any, prefix: str, out: dict[str, Any]) -> dict[str, Any]:
    """``value``'s leaves into ``out`` by dotted name under ``prefix`` (a list of dicts: ``<name>.#``
    its length, ``<name>.<i>.<key>`` its items); returns ``out``."""
    if isinstance(value, dict) and value:
        for key, item in value.items():
            flatten(item, f"{prefix}.{key}" if prefix else str(key), out)
    elif isinstance(value, (list, tuple)) and value and isinstance(value[0], dict):
        out[f"{prefix}.#"] = len(value)  # the count first: a team of another size differs there
        for i, item in enumerate(value):
            flatten(item, f"{prefix}.{i}", out)
    else:
        out[prefix] = list(value) if isinstance(value, tuple) else value
    return out


def resume_differences(saved: dict[str, Any], given: dict[str, Any]) -> list[Difference]:
    """Every field whose value differs between the checkpoint's hyperparameters ``saved`` and the
    given module's ``given`` (both ``module.hparams``-shaped: config groups as dicts), with its
    policy. A class swap is reported alone (every other field differs then too). A field only the
    given config has (added to the library after the checkpoint was written) is not compared; one
    only the checkpoint has (another module's group) differs as ``<absent>``."""
    saved = {k: v for k, v in saved.items() if k not in _SKIPPED}
    given = {k: v for k, v in given.items() if k not in _SKIPPED}
    if not saved:  # a checkpoint without hyperparameters (or a folder without meta.pt): nothing to compare
        return []
    old_class, new_class = saved.get(CLASS_KEY), given.get(CLASS_KEY)
    if old_class is not None and new_class is not None and old_class != new_class:
        return [Difference("class_path", old_class, new_class, *policy_of(CLASS_KEY))]
    old, new = flatten(saved, "", {}), flatten(given, "", {})
    if old_class is None or new_class is None:
        old.pop(CLASS_KEY, None), new.pop(CLASS_KEY, None)  # a Python fit records no class path
    out = []
    for field in sorted(
        old
    ):  # a field the checkpoint lacks is newer than it: its default keeps the old run's
        a, b = old[field], new.get(field, _ABSENT)
        if a != b:
            out.append(Difference(field.replace(".#", ""), a, b, *policy_of(field)))
    return out


def refusal(differences: list[Difference], ckpt_path: str) -> str | None:
    """The error text for the refused ``differences`` (None when none is refused)."""
    refused = [d for d in differences if d.policy == REFUSE]
    if not refused:
        return None
    lines = "\n".join(f"  model.{d.describe()} ({d.why})" for d in refused)
    return (
        f"--ckpt_path {ckpt_path}: the given config changes {len(refused)} field(s) that cannot change "
        f"on resume:\n{lines}\nGive the checkpoint's values, start a new run without --ckpt_path, or "
        "resume with --use_checkpoint_config true (the checkpoint's model config, the given one ignored)"
    )


def check_resume(checkpoint: dict[str, Any], hparams: dict[str, Any], trainer: Any) -> None:
    """In ``on_load_checkpoint``: when ``trainer`` resumes (``trainer.ckpt_path``), refuse a module
    whose ``hparams`` change a field of the checkpoint's that cannot change.

    Raises:
        ResumeConfigError: naming each refused field, the checkpoint's and the given value.
    """
    saved = checkpoint.get("hyper_parameters")
    if not saved or not getattr(trainer, "ckpt_path", None):  # load_from_checkpoint builds from them
        return
    error = refusal(resume_differences(saved, hparams), str(trainer.ckpt_path))
    if error is not None:
        raise ResumeConfigError(error)


def check_folder_config(ckpt_path: str, hparams: dict[str, Any]) -> None:
    """Before a sharded checkpoint folder's tensors load: refuse a module whose ``hparams`` change a
    field of the folder's saved ones that cannot change (as :func:`check_resume` does for a file,
    which is read whole before the module sees it).

    Raises:
        ResumeConfigError: naming each refused field, the checkpoint's and the given value.
    """
    saved, _ = saved_records(ckpt_path)
    error = refusal(resume_differences(saved, hparams), ckpt_path) if saved else None
    if error is not None:
        raise ResumeConfigError(error)


def applied_lines(differences: list[Difference]) -> list[str]:
    """One line per applied difference: ``resume: model.<field>: checkpoint x, given y (applied: why)``."""
    return [f"resume: model.{d.describe()} (applied: {d.why})" for d in differences if d.policy == APPLY]


def _with_schedulers(trainer: Any) -> list[tuple[Any, Any]]:
    """``(optimizer, its scheduler or None)`` for every optimizer of ``trainer``."""
    schedulers = {id(c.scheduler.optimizer): c.scheduler for c in trainer.lr_scheduler_configs}
    out = []
    for opt in trainer.optimizers:
        raw = getattr(opt, "_optimizer", opt)
        out.append((raw, schedulers.get(id(raw)) or schedulers.get(id(opt))))
    return out


def _base_rates(opt: Any, scheduler: Any) -> list[float]:
    return list(scheduler.base_lrs) if scheduler is not None else [g["lr"] for g in opt.param_groups]


RUN_RECORD = "run_config"
"""The checkpoint key of :class:`RunConfigRecord`'s trainer and data settings."""


SHARDED_META = "meta.pt"
"""The file of a sharded checkpoint folder (``strategy: fsdp2``, torch distributed checkpoint) that
holds everything but the tensors: hyperparameters, run record, loops (Lightning's ``_METADATA_FILENAME``)."""


def records_file(ckpt_path: str) -> str:
    """The file holding ``ckpt_path``'s hyperparameters: a sharded folder's :data:`SHARDED_META`, else
    ``ckpt_path`` itself."""
    meta = os.path.join(ckpt_path, SHARDED_META)
    return meta if os.path.isdir(ckpt_path) and os.path.isfile(meta) else ckpt_path


def folder_refusal(ckpt_path: str, sharded: bool) -> str | None:
    """The error text for a checkpoint folder given to a run whose strategy reads one file (None:
    ``ckpt_path`` is a file, or the run is ``sharded``)."""
    if sharded or not os.path.isdir(ckpt_path):
        return None
    return (
        f"--ckpt_path {ckpt_path}: a sharded checkpoint folder (written under trainer.strategy 'fsdp2'), "
        "given to a run of another strategy, which reads a single-file checkpoint: resume it with "
        "trainer.strategy: fsdp2 (any number of devices; a mid-epoch one needs the world size it was "
        "written under), or give a .ckpt file"
    )


def saved_records(ckpt_path: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """``(hyper_parameters, run_config)`` of the checkpoint at ``ckpt_path``: a file (memory-mapped: the
    weights are not read into memory) or a sharded folder (its :data:`SHARDED_META` alone: no tensor
    is read); ``{}`` / None when it has none (a folder without it: Lightning's loading refuses it)."""
    import torch

    ckpt_path = records_file(ckpt_path)
    if os.path.isdir(ckpt_path):
        return {}, None
    try:
        ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError:  # not a zip checkpoint: mmap needs one
        ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=True)
    return dict(ckpt.get("hyper_parameters") or {}), ckpt.get(RUN_RECORD)


def run_record(config: dict[str, Any]) -> dict[str, Any]:
    """The trainer's plain settings (limits, logging cadence, precision...; not its callbacks, logger
    or plugins) and the data's, by dotted name, from a ``fit`` section of the CLI's config dump."""
    trainer = {k: v for k, v in (config.get("trainer") or {}).items() if not isinstance(v, (dict, list))}
    record = flatten({"trainer": trainer, "data": config.get("data") or {}}, "", {})
    return {**record, SEED: config.get(SEED)}


SEED = "seed_everything"
"""The CLI's global seed: recorded so that a resume with another one says what it does."""
_SEED_WHY = (
    "not applied: the run continues from the checkpoint's RNG states, which a seed would only have "
    "started; for another seed, start a new run without --ckpt_path"
)


class RunConfigRecord(pl.Callback):
    """Writes ``record`` (:func:`run_record`) into every checkpoint as ``checkpoint["run_config"]``, so
    a resumed ``fit`` says which trainer and data settings changed (:func:`run_lines`)."""

    def __init__(self, record: dict[str, Any]) -> None:
        self.record = record

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        checkpoint[RUN_RECORD] = self.record


def run_lines(saved: dict[str, Any] | None, given: dict[str, Any]) -> list[str]:
    """One line per trainer or data setting that differs from the checkpoint's record (all applied:
    the given trainer and data run; a changed batch size, seed, shuffle or data set means the resumed
    run no longer sees the data an uninterrupted one would), and one for a changed ``seed_everything``
    (not applied: the checkpoint's RNG states continue)."""
    lines = []
    for key in sorted(set(saved or {}) | set(given)) if saved else []:
        old, new = saved.get(key, _ABSENT), given.get(key, _ABSENT)
        if key == SEED and old != new and old != _ABSENT:  # a record older than the seed's: nothing said
            lines.append(f"resume: {key}: checkpoint {old!r}, given {new!r} ({_SEED_WHY})")
        elif old != new and key != SEED and (old, new) not in _UNSET:
            why = "the given trainer runs" if key.startswith("trainer.") else _DATA_WHY
            lines.append(f"resume: {key}: checkpoint {old!r}, given {new!r} (applied: {why})")
    return lines


_DATA_WHY = "the given data runs; the resumed run's data may differ from an uninterrupted one's"
_UNSET = ((_ABSENT, None), (None, _ABSENT))  # not recorded on one side, None on the other: no line


def ignored_lines(given: Any, used: Any) -> list[str]:
    """``--use_checkpoint_config``: one line per given model field the checkpoint's config replaced
    (``given``, ``used``: the parsed ``model`` namespaces before and after).

    Both are compared as the module builds them (its ``hparams``; building loads no model): a field
    left unset and the value the module fills in (``advantage_mode`` None and an alias's ``mean``),
    or ``agents: x`` and the list of agents it expands to, are the same. A config the module cannot
    be built from is compared as given."""
    import importlib

    from jsonargparse import ArgumentParser

    def built(config: dict[str, Any]) -> dict[str, Any]:
        module, _, name = config["class_path"].rpartition(".")
        parser = ArgumentParser(exit_on_error=False)
        cls = getattr(importlib.import_module(module), name)
        parser.add_class_arguments(cls, "model", fail_untyped=False)
        init = {**config.get("init_args", {}), **config.get("dict_kwargs", {})}
        parsed = parser.parse_object({"model": init})
        instantiate = getattr(parser, "instantiate", None) or parser.instantiate_classes  # renamed in 4.49
        model = instantiate(parsed).model
        return {"class_path": config["class_path"], **dict(model.hparams)}

    def fields(ns: Any) -> dict[str, Any]:
        value = ns.as_dict() if hasattr(ns, "as_dict") else ns
        try:
            value = built(value)
        except Exception:  # noqa: BLE001 - any failure to build: compared as given
            pass
        flat = flatten(value if isinstance(value, dict) else {}, "", {})
        return {k.replace("init_args.", "").replace("dict_kwargs.", ""): v for k, v in flat.items()}

    old, new = fields(given), fields(used)
    return [
        f"resume: model.{k}: given {old.get(k, _ABSENT)!r} ignored, the checkpoint's "
        f"{new.get(k, _ABSENT)!r} used (--use_checkpoint_config)"
        for k in sorted(set(old) | set(new))
        if old.get(k, _ABSENT) != new.get(k, _ABSENT)
    ]


def capture_learning_rates(trainer: Any) -> list[list[float]]:
    """The base learning rate of every param group of every optimizer (the scheduler's ``base_lrs``
    when it has one), as the given config builds them: call before Lightning restores the
    optimizers' state."""
    return [_base_rates(opt, scheduler) for opt, scheduler in _with_schedulers(trainer)]


def apply_given_learning_rates(trainer: Any, fresh: list[list[float]] | None) -> list[str]:
    """When ``trainer`` resumed, put the given config's learning rates (``fresh``:
    :func:`capture_learning_rates` before the restore) into the restored optimizers where they
    differ from the checkpoint's, and log a line for each.

    With a scheduler the restored ``base_lrs`` are the checkpoint's rates: each group's rate is scaled
    by ``given / saved`` and its ``initial_lr`` and the scheduler's base rate set to the given one
    (exact for every schedule that multiplies the base rate: LambdaLR, StepLR, linear warm-up,
    cosine to 0).

    Returns:
        One line per changed optimizer: ``resume: optimizer <i> learning rate [old] -> [new]``.
    """
    if fresh is None or not trainer.ckpt_path:
        return []
    lines = []
    for i, ((opt, scheduler), rates) in enumerate(zip(_with_schedulers(trainer), fresh)):
        bases = _base_rates(opt, scheduler)
        if bases == rates:
            continue
        for g, (group, base, rate) in enumerate(zip(opt.param_groups, bases, rates)):
            group["lr"] = group["lr"] * (rate / base) if scheduler is not None and base else rate
            if "initial_lr" in group:
                group["initial_lr"] = rate
            if scheduler is not None:
                scheduler.base_lrs[g] = rate
                scheduler._last_lr = [grp["lr"] for grp in opt.param_groups]
        lines.append(f"resume: optimizer {i} learning rate {bases} -> {rates} (the given config's)")
        rank_zero_info(lines[-1])
    return lines
