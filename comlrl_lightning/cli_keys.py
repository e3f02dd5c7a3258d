"""Every unknown key of a command line's config at once (jsonargparse stops at its first).

:func:`given_config` merges what the command line gives (its ``--config`` files, then its options) and
:func:`unknown_keys` checks each key against the parser's options and, under a ``class_path``, against
what that class accepts, giving one line per unknown key (:func:`~comlrl_lightning.cli_errors.unknown_key`:
the closest allowed key, or where a setting carried from another library lives here).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from comlrl_lightning.cli_errors import _KEY_HINTS, accepted_keys, unknown_key


def given_config(args: list[str]) -> dict[str, Any]:
    """The config a command line gives, for :func:`unknown_keys`: its ``--config`` files merged in order
    (a changed ``class_path`` drops the earlier ``init_args``), then its ``--a.b=value`` options. Best
    effort: an unreadable file, an appended ``+=`` value or a flag without a value is left out."""
    import yaml

    config: dict[str, Any] = {}
    items = list(args)
    while items:
        arg = items.pop(0)
        if not arg.startswith("--") or "+=" in arg:
            continue
        key, eq, value = arg[2:].partition("=")
        if not eq:
            if not items or items[0].startswith("--"):
                continue
            value = items.pop(0)
        try:
            if key == "config":
                with open(value, encoding="utf-8") as f:
                    _merge(config, yaml.safe_load(f) or {})
                continue
            parsed = yaml.safe_load(value)
        except (OSError, yaml.YAMLError):
            continue
        node: dict[str, Any] = {}
        leaf = node
        *parents, last = key.split(".")
        for part in parents:
            leaf = leaf.setdefault(part, {})
        leaf[last] = (
            {"class_path": parsed} if isinstance(parsed, str) and last in ("model", "data") else parsed
        )
        _merge(config, node)
    return config


def _merge(into: dict[str, Any], new: Any) -> None:
    if not isinstance(new, dict):
        return
    for key, value in new.items():
        old = into.get(key)
        swapped = (
            isinstance(old, dict)
            and isinstance(value, dict)
            and value.get("class_path")
            not in (
                None,
                old.get("class_path"),
            )
        )
        if isinstance(old, dict) and isinstance(value, dict) and not swapped:
            _merge(old, value)
        else:
            into[key] = value


def unknown_keys(config: dict[str, Any], options: Iterable[str]) -> list[str]:
    """One line (:func:`unknown_key`) per key of ``config`` (:func:`given_config`) that no option and no
    class takes, in the config's order: the top level and ``trainer`` against the parser's ``options``,
    the ``init_args`` of every ``class_path`` (``model``, ``data``, loggers, callbacks) against what its
    class accepts, group by group (``rollout.num_generation``). A top-level key that is a key of the
    model, the data or the trainer is pointed there (``num_generations`` ->
    ``model.init_args.rollout.num_generations``)."""
    names = {o.lstrip("-") for o in options}
    out: list[str] = []

    def known(key: str) -> bool:
        return key in names or any(n.startswith(f"{key}.") for n in names)

    classes = {
        part: accepted_keys(config[part]["class_path"])
        for part in ("model", "data")
        if isinstance(config.get(part), dict) and isinstance(config[part].get("class_path"), str)
    }
    for key, value in config.items():
        if not known(key):
            out.append(_misplaced(key, names, classes, config))
        elif key == "trainer" and isinstance(value, dict):
            for sub, sub_value in value.items():
                if sub in _KEY_HINTS and not known(f"trainer.{sub}"):
                    out.append(f"trainer.{sub}: no such key; {_KEY_HINTS[sub]}")
                elif not known(f"trainer.{sub}"):
                    trainer_keys = [n for n in names if n.startswith("trainer.")]
                    out.append(unknown_key(f"trainer.{sub}", f"trainer.{sub}", trainer_keys, ""))
                else:
                    out += _class_keys(f"trainer.{sub}", sub_value)
        else:
            out += _class_keys(key, value)
    return out


def _misplaced(key: str, names: set[str], classes: dict[str, list[str]], config: dict[str, Any]) -> str:
    """The line for an unknown top-level ``key``: where a key of that name lives, else the closest."""
    places = [n for n in names if n.startswith("trainer.") and n.rpartition(".")[2] == key]
    for part, accepted in classes.items():
        places += [f"{part}.init_args.{k}" for k in accepted if k.rpartition(".")[2] == key]
    if key in _KEY_HINTS:
        return f"{key}: no such key; {_KEY_HINTS[key]}"
    if places:
        return f"{key}: not a top-level key; it is {' or '.join(sorted(places))}"
    return unknown_key(key, key, sorted({n.split(".")[0] for n in names}), "")


def _class_keys(where: str, value: Any) -> list[str]:
    """The lines for the unknown ``init_args`` keys of ``value`` (a ``class_path`` dict, or a list of
    them) given at ``where``."""
    if isinstance(value, list):
        return [line for i, v in enumerate(value) for line in _class_keys(f"{where}[{i}]", v)]
    if not isinstance(value, dict) or not isinstance(value.get("class_path"), str):
        return []
    init = value.get("init_args")
    accepted = accepted_keys(value["class_path"])
    if not isinstance(init, dict) or not accepted:
        return []
    out = []
    for name in _flat_keys(init, accepted):
        if name not in accepted:
            out.append(unknown_key(f"{where}.init_args.{name}", name, accepted, value["class_path"]))
    return out


def _flat_keys(init: dict[str, Any], accepted: list[str], prefix: str = "") -> list[str]:
    """``init``'s keys, a group's dict opened into ``group.key`` (not a dict-valued field's)."""
    out = []
    for key, value in init.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and any(a.startswith(f"{name}.") for a in accepted):
            out += _flat_keys(value, accepted, f"{name}.")
        else:
            out.append(name)
    return out
