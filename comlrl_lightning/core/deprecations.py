"""The pre-grouping spellings of a module's config, still accepted with a DeprecationWarning: flat
keyword arguments (``MAGRPO(agents, num_generations=2)``) and renamed keys (:data:`DEPRECATED_KEYS`).
"""

from __future__ import annotations

import warnings
from dataclasses import fields, replace
from typing import Any

from comlrl_lightning.core.config import GROUPS

DEPRECATED_KEYS: dict[str, tuple[str, str]] = {
    "scale_advantages": ("advantage", "scale_rewards"),
    "loss_aggregation": ("loss", "loss_type"),
}
"""Old flat names whose field was renamed: old name -> (group, new name)."""


def group_flat_kwargs(flat: dict[str, Any], groups: dict[str, Any]) -> dict[str, Any]:
    """Build every config group from ``groups`` (given objects or None) plus flat keyword arguments.

    ``MAGRPO(agents, num_generations=2)`` (the pre-grouping spelling) keeps working: each flat key
    goes to the group declaring it, with a DeprecationWarning; renamed keys (:data:`DEPRECATED_KEYS`)
    go to their new field. A non-default group object given alongside flat keys of the same group is
    an error; a dict is taken as that group's fields.

    Raises:
        TypeError: an unknown flat key (naming it and the groups' fields).
        ValueError: a flat key for a group that was also given as an object, or a bad value.
    """
    owner = {f.name: (g, f.name) for g, cls in GROUPS.items() for f in fields(cls)}
    owner.update(DEPRECATED_KEYS)
    per_group: dict[str, dict[str, Any]] = {g: {} for g in GROUPS}
    for key, value in flat.items():
        if key not in owner:
            raise TypeError(f"unknown argument {key!r}; config fields: {sorted(owner)}")
        group, name = owner[key]
        hint = f"use {group}={GROUPS[group].__name__}({name}=...) (YAML: {group}: {{{name}: ...}})"
        warnings.warn(f"{key}=... is deprecated: {hint}", DeprecationWarning, stacklevel=3)
        per_group[group][name] = value
    out = {}
    for group, cls in GROUPS.items():
        given = groups.get(group)
        if isinstance(given, dict):  # hparams of a checkpoint, or a plain mapping from Python
            given = cls(**given)
        if per_group[group]:
            if given is not None and given != cls():
                raise ValueError(
                    f"{group}: given as an object and as flat keys {sorted(per_group[group])}; give one"
                )
            given = cls(**per_group[group])
        out[group] = replace(given) if given is not None else cls()  # a copy: defaults are shared
    return out
