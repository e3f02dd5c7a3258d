"""`AdapterConfig`: a per-agent LoRA adapter (any ``peft.LoraConfig`` field), checked without loading a model.

An agent whose :class:`~comlrl_lightning.team.agents.AgentSpec` has ``adapter`` trains only its adapter;
its base is frozen (its own, or an earlier adapter agent's with ``share_weights_with``: held once).
Building it is :class:`~comlrl_lightning.team.kinds.LoraAdapter`'s work (the ``peft`` extra). Four
fields are declared here, with this library's defaults; every other ``LoraConfig`` field (``use_dora``,
``use_rslora``, ``bias``, ``modules_to_save``, ...) is passed through, checked against PEFT's own field
list and types (:meth:`AdapterConfig.check`). The names are checked against the agent's model in
:mod:`~comlrl_lightning.team.adapter_targets`.
"""

from __future__ import annotations

import difflib
import enum
import importlib.util
import types
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Literal, Union, get_args, get_origin

RESERVED = {
    "task_type": "the library sets 'CAUSAL_LM'",
    "peft_type": "it is LoRA",
    "inference_mode": "the adapter trains (True would freeze it)",
    "base_model_name_or_path": "PEFT records the agent's model",
    "revision": "PEFT records the agent's model",
    "auto_mapping": "PEFT sets it",
    "peft_version": "PEFT sets it",
}
"""``LoraConfig`` fields an agent's adapter does not take, with why (the library or PEFT sets them)."""

OTHER_NAMES = {
    "rank": "r",
    "lora_r": "r",
    "alpha": "lora_alpha",
    "dropout": "lora_dropout",
    "lora_target_modules": "target_modules",
    "lora_target_parameters": "target_parameters",
    "lora_modules_to_save": "modules_to_save",
}
"""Names users bring from TRL's ``ModelConfig`` (``lora_r``, ``lora_target_modules``, ...) and elsewhere
-> the ``LoraConfig`` field."""


@dataclass
class AdapterConfig:
    """A LoRA adapter on an agent's frozen base (PEFT ``LoraConfig`` names; TRL's ``peft_config``).

    Attributes:
        r: rank of the low-rank update (>= 1). Default 8 (PEFT's).
        lora_alpha: scaling numerator; the update is scaled by ``lora_alpha / r`` (> 0; with
            ``use_rslora`` by ``lora_alpha / sqrt(r)``). Default 16.
        target_modules: module names (or dotted name suffixes) of the model's layers that get an
            adapter, one string read as a regular expression over full module names, or
            ``"all-linear"`` (every linear layer but the output layer, PEFT's shorthand). Checked
            against the model's module names before it loads. Default ``"all-linear"``.
        lora_dropout: dropout on the adapter's input, in [0, 1). Default 0.0: RL log-probs must come
            from the distribution that sampled the completions (every other dropout is off too).
        options: every other ``peft.LoraConfig`` field by its name (``use_dora``, ``use_rslora``,
            ``bias``, ``modules_to_save``, ``init_lora_weights``, ``exclude_modules``,
            ``layers_to_transform``, ``rank_pattern``, ...), given beside ``r`` in YAML or a dict
            (``{r: 8, use_dora: true}``: :meth:`from_dict` moves them here, where ``asdict`` finds them).
            Default none: PEFT's defaults. Each is checked against ``LoraConfig``'s field list and type.
    """

    r: int = 8
    lora_alpha: float = 16
    target_modules: list[str] | str = "all-linear"
    lora_dropout: float = 0.0
    options: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> AdapterConfig:
        """The config of a YAML / TRL-style mapping: the declared fields by name, every other key
        into ``options`` (an ``options`` mapping too: what ``asdict`` wrote). Checked by :meth:`check`,
        which knows the agent's index."""
        declared = [f.name for f in fields(cls) if f.name != "options"]
        given = values.get("options") or {}
        rest = {k: v for k, v in values.items() if k not in (*declared, "options")}
        options = {**given, **rest} if isinstance(given, dict) else given  # not a mapping: check() says so
        return cls(**{k: values[k] for k in declared if k in values}, options=options)

    def check(self, where: str) -> None:
        """Raises ValueError naming ``<where>.<field>``, the value and what is allowed: a declared
        field's value, an option that is no ``LoraConfig`` field (with the closest one) or one
        of the wrong type, or what ``LoraConfig`` itself refuses; also when the ``peft`` package
        (the ``lora`` extra) is missing."""
        if isinstance(self.r, bool) or not isinstance(self.r, int) or self.r < 1:
            raise ValueError(f"{where}.r: got {self.r!r}, allowed: an integer >= 1")
        if not _number(self.lora_alpha) or not self.lora_alpha > 0:
            raise ValueError(f"{where}.lora_alpha: got {self.lora_alpha!r}, allowed: a number > 0")
        if not _number(self.lora_dropout) or not 0 <= self.lora_dropout < 1:
            raise ValueError(
                f"{where}.lora_dropout: got {self.lora_dropout!r}, allowed: 0 <= lora_dropout < 1"
            )
        targets = self.target_modules
        if not (
            (isinstance(targets, str) and targets)
            or (
                isinstance(targets, (list, tuple))
                and targets
                and all(isinstance(t, str) and t for t in targets)
            )
        ):
            raise ValueError(
                f"{where}.target_modules: got {targets!r}, allowed: 'all-linear' or a non-empty list of "
                "module names (e.g. ['q_proj', 'v_proj'])"
            )
        if not isinstance(self.options, dict):
            raise ValueError(
                f"{where}.options: got {self.options!r}, allowed: a mapping of LoraConfig fields"
            )
        if importlib.util.find_spec("peft") is None:
            raise ValueError(
                f"{where}: a LoRA adapter needs the 'peft' package, which is not installed: "
                "pip install 'comlrl-lightning[lora]' (make setup installs it)"
            )
        self._check_options(where)
        try:  # LoraConfig's own cross-field rules (e.g. layers_pattern needs layers_to_transform)
            self.peft_config()
        except (ValueError, TypeError) as err:
            why = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise ValueError(f"{where}: peft.LoraConfig refuses {self.options or 'it'}: {why}") from None

    def _check_options(self, where: str) -> None:
        types_ = lora_field_types()
        declared = [f.name for f in fields(self) if f.name != "options"]
        allowed = sorted(set(types_) - set(RESERVED))
        for key, value in self.options.items():
            if key in declared:
                raise ValueError(f"{where}.options.{key}: give it as {where}.{key}, not among options")
            if key in RESERVED:
                raise ValueError(f"{where}.{key}: got {value!r}, but {RESERVED[key]}; leave it out")
            if key not in types_:
                close = (
                    [OTHER_NAMES[key]] if key in OTHER_NAMES else difflib.get_close_matches(key, allowed, n=1)
                )
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise ValueError(
                    f"{where}: unknown field {key!r}{hint} allowed: a peft.LoraConfig field, {allowed}"
                )
            try:
                coerce(value, types_[key])
            except TypeError:
                raise ValueError(
                    f"{where}.{key}: got {value!r}, allowed: {describe(types_[key])} (peft.LoraConfig.{key})"
                ) from None
            except ValueError as err:  # a nested config class's own check (e.g. eva_config's)
                why = (str(err).strip().splitlines() or [""])[0]
                raise ValueError(f"{where}.{key}: got {value!r}: {why}") from None

    def peft_config(self) -> Any:
        """PEFT's ``LoraConfig`` for a causal LM with these fields (imports ``peft``); an option's
        mapping becomes the config class its field names (e.g. ``eva_config``).

        Raises:
            TypeError: an option does not fit its field's type (:meth:`check` names it first).
            ValueError: ``LoraConfig`` refuses the combination.
        """
        from peft import LoraConfig

        types_ = lora_field_types()
        targets = self.target_modules if isinstance(self.target_modules, str) else list(self.target_modules)
        return LoraConfig(
            r=self.r,
            lora_alpha=self.lora_alpha,
            target_modules=targets,
            lora_dropout=float(self.lora_dropout),
            task_type="CAUSAL_LM",
            **{k: coerce(v, types_[k]) for k, v in self.options.items()},
        )


def _number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float))


def lora_field_types() -> dict[str, Any]:
    """``peft.LoraConfig``'s fields -> their types (this PEFT version's: a new field is accepted as
    soon as PEFT has it)."""
    import typing

    from peft import LoraConfig

    return typing.get_type_hints(LoraConfig)


def coerce(value: Any, hint: Any) -> Any:
    """``value`` as a ``LoraConfig`` field of type ``hint`` takes it: YAML's lists become tuples where
    the type says tuple, and a mapping becomes the config class the type names (YAML has no
    instances). Types this does not know pass unchanged (``LoraConfig`` has the last word).

    Raises:
        TypeError: ``value`` does not fit ``hint`` (a string for a bool, an unknown ``Literal``...).
    """
    origin, args = get_origin(hint), get_args(hint)
    if hint is Any:
        return value
    if origin in (Union, types.UnionType):
        for arg in args:
            try:
                return coerce(value, arg)
            except TypeError:
                continue
        raise TypeError(value)
    if origin is Literal:
        if any(_literal_fits(value, a) for a in args):
            return value
        raise TypeError(value)
    if hint is type(None) or hint is None:
        if value is None:
            return value
        raise TypeError(value)
    if hint in (int, float, bool, str):
        ok = isinstance(value, hint) and not (hint is not bool and isinstance(value, bool))
        if ok or (hint is float and _number(value)):
            return value
        raise TypeError(value)
    if origin in (list, tuple) or hint in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise TypeError(value)
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(value) != len(args):
                raise TypeError(value)
            return tuple(coerce(v, a) for v, a in zip(value, args))
        items = [coerce(v, args[0]) for v in value] if args else list(value)
        return tuple(items) if origin is tuple or hint is tuple else items
    if origin is dict or hint is dict:
        if not isinstance(value, dict):
            raise TypeError(value)
        if len(args) == 2:
            return {coerce(k, args[0]): coerce(v, args[1]) for k, v in value.items()}
        return value
    if isinstance(hint, type):
        if isinstance(value, hint):
            return value
        if is_dataclass(hint) and isinstance(value, dict):
            return hint(**value)  # an unknown key is PEFT's TypeError: the field is named by the caller
        if issubclass(hint, enum.Enum):
            try:
                return hint(value)
            except ValueError:
                raise TypeError(value) from None
        raise TypeError(value)
    return value


def _literal_fits(value: Any, allowed: Any) -> bool:
    if isinstance(allowed, str) and "[" in allowed and isinstance(value, str):
        # PEFT writes a family of values as a placeholder: 'pissa_niter_[number of iters]'
        stem = allowed.split("[", 1)[0]
        return value.startswith(stem) and value[len(stem) :].isdigit()
    return type(value) is type(allowed) and value == allowed


def describe(hint: Any) -> str:
    """``hint`` in words for an error message (``bool``, ``one of ['none', 'all', 'lora_only']``,
    ``a list of str or None``)."""
    origin, args = get_origin(hint), get_args(hint)
    if origin in (Union, types.UnionType):
        return " or ".join(describe(a) for a in args)
    if origin is Literal:
        return f"one of {list(args)}"
    if hint is type(None):
        return "None"
    if origin in (list, tuple):
        return f"a list of {describe(args[0])}" if args else "a list"
    if origin is dict:
        return "a mapping"
    return getattr(hint, "__name__", str(hint))
