"""A LoRA adapter's module names checked against the agent's model before any model loads.

PEFT checks ``target_modules`` only once the weights are in memory, in a long traceback that names
neither the config field nor the model's module names, and it ignores a listed name that matches
nothing as long as another one matches (``['c_attn', 'q_proj']`` on GPT-2 trains ``c_attn`` alone).
Here the agent's module tree is built on the meta device from its config (no weight is read; ~0.03 s
for SmolLM2-135M), each name of ``target_modules``, ``exclude_modules`` and ``modules_to_save`` is
matched the way PEFT matches it, and PEFT itself is then run on that tree, so a name that matches
nothing, a module LoRA cannot wrap, or a combination PEFT refuses is one line naming the field, the
value, near matches and the model's layer names.
"""

from __future__ import annotations

import difflib
import re
import warnings
from typing import Any

import torch
from torch import nn

from comlrl_lightning.team.agents import _TINY, BUILTIN_PREFIX, AgentSpec
from comlrl_lightning.team.builtin import BUILTIN_MODELS, converted_folder

ALL_LINEAR = "all-linear"
"""PEFT's shorthand for every linear layer but the output layer."""


def lora_layer_types() -> tuple[type, ...]:
    """The module types PEFT's LoRA wraps (``peft/tuners/lora/model.py``, ``_create_new_module``);
    any other module named by ``target_modules`` makes PEFT raise."""
    from transformers.pytorch_utils import Conv1D

    return (nn.Linear, nn.Embedding, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.MultiheadAttention, Conv1D)


class _NoVocabulary:
    """Stands in for a ``builtin:tiny-*`` tokenizer when only the module tree is built: the vocabulary
    sizes the embedding, never a module's name (and the BPE one would be read from disk)."""

    eos_token_id = pad_token_id = 0

    def __len__(self) -> int:
        return 8


def module_skeleton(spec: AgentSpec) -> nn.Module | None:
    """Agent ``spec``'s causal LM on the meta device, built from its config alone (``config.json`` of a
    local folder, the Hugging Face cache or a converted builtin; a builtin not converted yet: its
    ``model_type``'s default config, the same module names). None when the config cannot be read
    without loading the model; then the build's own error is the only one."""
    from transformers import AutoConfig, AutoModelForCausalLM

    name = spec.model.removeprefix(BUILTIN_PREFIX) if spec.model.startswith(BUILTIN_PREFIX) else None
    remote = bool(spec.model_kwargs.get("trust_remote_code", False))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the real load says what matters about this config
        if name in _TINY:
            with torch.device("meta"):
                return _TINY[name][1](_NoVocabulary(), **spec.model_kwargs)
        try:
            if name is not None:
                folder = converted_folder(name)
                model_type = BUILTIN_MODELS[name].model_type
                if folder is None and model_type is None:
                    return None
                config = (
                    AutoConfig.for_model(model_type)
                    if folder is None
                    else AutoConfig.from_pretrained(str(folder))
                )
            else:
                config = AutoConfig.from_pretrained(spec.model, trust_remote_code=remote)
            known = config.to_dict()  # from_pretrained passes config fields in model_kwargs to the config
            for key, value in spec.model_kwargs.items():
                if key in known:
                    setattr(config, key, value)
            with torch.device("meta"):
                return AutoModelForCausalLM.from_config(config, trust_remote_code=remote)
        except (OSError, ValueError, KeyError, ImportError):
            return None


def check_adapter_on_model(spec: AgentSpec, where: str) -> None:
    """Refuse agent ``spec``'s adapter (``where``: ``agents[i].adapter``) when a name in it matches no
    module of the agent's model, names a module LoRA cannot wrap, or PEFT refuses the adapter on the
    model's module tree; nothing when the tree cannot be built from the config alone.

    Raises:
        ValueError: ``<where>.<field>: got <value>; ...`` with near matches and the allowed names.
    """
    # building the tree and PEFT's layers draws initial weights: from a forked generator, so that a
    # seeded run's random numbers are the same with the check as without it
    with torch.random.fork_rng(devices=[]):
        _check(spec, where)


def _check(spec: AgentSpec, where: str) -> None:
    adapter = spec.adapter
    assert adapter is not None, "called for adapter agents only"
    skeleton = module_skeleton(spec)
    if skeleton is None:
        return
    modules = {n: m for n, m in skeleton.named_modules(remove_duplicate=False) if n}
    lora_types = lora_layer_types()
    layers = sorted({n.rsplit(".", 1)[-1] for n, m in modules.items() if isinstance(m, lora_types)})
    label = f"{spec.model} ({type(skeleton).__name__})"
    allowed = (
        f"allowed: {ALL_LINEAR!r} or names of its layers LoRA can wrap, {layers} (a dotted suffix such "
        "as 'layers.0.mlp.up_proj' narrows one; a single string is a regular expression over full names)"
    )
    targets = adapter.target_modules
    if targets != ALL_LINEAR:
        for key, matched in _matches(targets, list(modules)):
            if not matched:
                hint = (
                    _near(key, [*layers, ALL_LINEAR])
                    if key != ALL_LINEAR
                    else " (give it alone, not in a list)"
                )
                if isinstance(targets, str) and not _is_regex(targets):
                    hint = " (not a regular expression)"
                raise ValueError(
                    f"{where}.target_modules: got {targets!r}; {key!r} matches no module of {label}{hint}; "
                    + allowed
                )
            wrong = sorted(
                {type(modules[n]).__name__ for n in matched if not isinstance(modules[n], lora_types)}
            )
            if wrong:
                raise ValueError(
                    f"{where}.target_modules: got {targets!r}; {key!r} names {wrong} modules of {label}, "
                    f"which LoRA cannot wrap; {allowed}"
                )
    exclude = adapter.options.get("exclude_modules")
    for key, matched in _matches(exclude, list(modules)) if exclude else []:
        if not matched:
            raise ValueError(
                f"{where}.exclude_modules: got {exclude!r}; {key!r} matches no module of {label}"
                f"{_near(key, layers)}; allowed: names of its layers, {layers}"
            )
    names = sorted({n.rsplit(".", 1)[-1] for n in modules} - {str(i) for i in range(len(modules))})
    for key in adapter.options.get("modules_to_save") or []:
        if not any(n.endswith(key) for n in modules):  # PEFT's rule for modules_to_save: a plain suffix
            raise ValueError(
                f"{where}.modules_to_save: got {adapter.options['modules_to_save']!r}; {key!r} matches no "
                f"module of {label}{_near(key, names)}; allowed: its module names, {names}"
            )
    _dry_run(adapter, skeleton, where, label)


def _matches(targets: list[str] | str, names: list[str]) -> list[tuple[str, list[str]]]:
    """``(key, module names it matches)`` per key, the way PEFT matches: a string is one regular
    expression over full names (``re.fullmatch``); a list's key is a full name or a dotted suffix."""
    if isinstance(targets, str):
        try:
            return [(targets, [n for n in names if re.fullmatch(targets, n)])]
        except re.error:
            return [(targets, [])]
    return [(key, [n for n in names if n == key or n.endswith(f".{key}")]) for key in targets]


def _is_regex(text: str) -> bool:
    try:
        re.compile(text)
    except re.error:
        return False
    return True


def _near(key: str, candidates: list[str]) -> str:
    close = difflib.get_close_matches(key, candidates, n=2, cutoff=0.6)
    return f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""


def _dry_run(adapter: Any, skeleton: nn.Module, where: str, label: str) -> None:
    """PEFT's own checks on the meta tree (layer types, layer indices, DoRA...), before any load."""
    from peft import get_peft_model

    config = adapter.peft_config()
    config.init_lora_weights = False  # pissa / olora / eva initialise from weights, which meta has none of
    with warnings.catch_warnings(), torch.device("meta"):
        warnings.simplefilter("ignore")
        try:
            get_peft_model(skeleton, config)
        except ValueError as err:
            why = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise ValueError(f"{where}: PEFT refuses this adapter on {label}: {why}") from None
        except (RuntimeError, NotImplementedError, TypeError):
            pass  # an operation the meta device lacks, not the config: the real build decides
